// graphile-worker's side of the benchmarks: `node graphile_worker.js enqueue DSN batch|one PAYLOADS.json`.
// Batch is `addJobs` (one call, one statement), one at a time is `addJob` awaited job after job, both through
// WorkerUtils on its own pool, the schema migrated before the clock starts.
'use strict'
const { load, version, payloads, report, seconds } = require('./node_common')
const { makeWorkerUtils } = load('graphile-worker')

async function enqueue (dsn, mode, file) {
  const jobs = payloads(file)
  const utils = await makeWorkerUtils({ connectionString: dsn })
  await utils.migrate()
  const began = process.hrtime.bigint()
  if (mode === 'batch') {
    await utils.addJobs(jobs.map((payload) => ({ identifier: 'noop', payload })))
  } else {
    for (const payload of jobs) await utils.addJob('noop', payload)
  }
  const elapsed = seconds(began)
  const found = await utils.withPgClient((client) => client.query('SELECT count(*)::int AS n FROM graphile_worker._private_jobs'))
  await utils.release()
  report({ seconds: elapsed, jobs: found.rows[0].n, version: version('graphile-worker') })
}

const [command, ...rest] = process.argv.slice(2)
const commands = { enqueue }
if (!commands[command]) {
  process.stderr.write(`unknown command ${command}; known: ${Object.keys(commands).join(', ')}\n`)
  process.exit(2)
}
commands[command](...rest).catch((error) => { process.stderr.write(`${error.stack}\n`); process.exit(1) })
