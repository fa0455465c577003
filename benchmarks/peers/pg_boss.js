// pg-boss's side of the benchmarks: `node pg_boss.js enqueue DSN batch|one PAYLOADS.json`.
// Batch is `insert` (one call), one at a time is `send` awaited job after job; the queue is created and the
// schema installed by `start()` before the clock starts, with its supervisor and scheduler off (they are the
// maintenance of a running queue, not part of enqueueing).
'use strict'
const { load, version, payloads, report, seconds } = require('./node_common')
const PgBoss = load('pg-boss')

const QUEUE = 'noop'

async function enqueue (dsn, mode, file) {
  const jobs = payloads(file)
  const boss = new PgBoss({ connectionString: dsn, supervise: false, schedule: false })
  boss.on('error', (error) => process.stderr.write(`${error.stack}\n`))
  await boss.start()
  await boss.createQueue(QUEUE)
  const began = process.hrtime.bigint()
  if (mode === 'batch') {
    await boss.insert(jobs.map((data) => ({ name: QUEUE, data })))
  } else {
    for (const data of jobs) await boss.send(QUEUE, data)
  }
  const elapsed = seconds(began)
  const found = await boss.getDb().executeSql('SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1', [QUEUE])
  await boss.stop({ graceful: false, wait: true })
  report({ seconds: elapsed, jobs: found.rows[0].n, version: version('pg-boss') })
}

const [command, ...rest] = process.argv.slice(2)
const commands = { enqueue }
if (!commands[command]) {
  process.stderr.write(`unknown command ${command}; known: ${Object.keys(commands).join(', ')}\n`)
  process.exit(2)
}
commands[command](...rest).catch((error) => { process.stderr.write(`${error.stack}\n`); process.exit(1) })
