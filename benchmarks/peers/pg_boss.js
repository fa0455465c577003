// pg-boss's side of the benchmarks.
//
// `node pg_boss.js enqueue DSN batch|one PAYLOADS.json`: batch is `insert` (one call), one at a time is `send`
// awaited job after job; the queue is created and the schema installed by `start()` before the clock starts,
// with its supervisor and scheduler off (they are the maintenance of a running queue, not part of enqueueing).
//
// `node pg_boss.js drain DSN SETTING.json`: its fastest documented loop, `fetch(queue, { batchSize })` then
// `complete(queue, ids)` of the whole batch, until a fetch finds nothing (`work()` polls on a timer, at best
// every 0.5 s, and completes job by job).
//
// `node pg_boss.js latency-worker DSN TOTAL` and `latency-producer DSN RATE TOTAL`: pickup latency, as
// graphile_worker.js measures it. pg-boss 10 has no LISTEN/NOTIFY: `work()` polls, at most every 0.5 s (its
// documented minimum, used here), and fetches again at once while a fetch finds jobs.
'use strict'
const { load, version, payloads, report, exit, seconds, ready, cpuSeconds } = require('./node_common')
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

async function open (dsn, max) {
  const boss = new PgBoss({ connectionString: dsn, supervise: false, schedule: false, max })
  boss.on('error', (error) => process.stderr.write(`${error.stack}\n`))
  await boss.start()
  return boss
}

async function drain (dsn, settingJson) {
  const setting = JSON.parse(settingJson)
  const boss = await open(dsn, 2)
  await boss.getDb().executeSql('SELECT 1')
  let done = 0
  await ready()
  const cpu = process.cpuUsage()
  for (;;) {
    const jobs = await boss.fetch(QUEUE, { batchSize: setting.batch })
    if (!jobs || jobs.length === 0) break
    for (const job of jobs) done += job.data ? 1 : 0
    await boss.complete(QUEUE, jobs.map((job) => job.id))
  }
  report({ done, cpu_seconds: cpuSeconds(cpu), version: version('pg-boss') })
  await boss.stop({ graceful: false, wait: true })
}

async function install (dsn) {
  const boss = await open(dsn, 1)
  await boss.createQueue(QUEUE)
  await boss.stop({ graceful: false, wait: true })
  report({ version: version('pg-boss') })
}

async function fill (dsn, file) {
  const boss = await open(dsn, 1)
  const db = boss.getDb()
  await db.executeSql('DELETE FROM pgboss.job')
  const jobs = payloads(file)
  for (let first = 0; first < jobs.length; first += 5000) {
    await boss.insert(jobs.slice(first, first + 5000).map((data) => ({ name: QUEUE, data })))
  }
  await db.executeSql('VACUUM ANALYZE pgboss.job')
  await boss.stop({ graceful: false, wait: true })
  report({ jobs: jobs.length })
}

// Wall-clock milliseconds with sub-millisecond precision, comparable between processes.
function now () {
  return performance.timeOrigin + performance.now()
}

// A running worker polling at pg-boss's shortest interval, until TOTAL jobs have started; prints each job's
// wait from its `sent` time to its start. A fetch takes up to 1,000 jobs, what 0.5 s brings at the highest
// rate offered to one producer: with 100 it took 200 jobs/s and fell behind by seconds.
async function latencyWorker (dsn, total) {
  const boss = await open(dsn, 4)
  const waits = []
  let finished
  const allStarted = new Promise((resolve) => { finished = resolve })
  await boss.work(QUEUE, { pollingIntervalSeconds: 0.5, batchSize: 1000 }, async (jobs) => {
    const started = now()
    for (const job of jobs) waits.push(started - job.data.sent)
    if (waits.length >= Number(total)) finished()
  })
  await ready()
  await allStarted
  report({ waits, version: version('pg-boss') })
  await boss.stop({ graceful: false, wait: true })
}

// Job n is due at n / RATE seconds; the jobs that have come due go in with one `insert` (one `send` when one is
// due), each carrying the time just before the call.
async function latencyProducer (dsn, rate, total) {
  const boss = await open(dsn, 2)
  await ready()
  await new Promise((resolve) => setTimeout(resolve, 1000))
  const began = now()
  let sent = 0
  while (sent < total) {
    const elapsed = (now() - began) / 1000
    const due = Math.min(total, Math.floor(elapsed * rate) + 1) - sent
    if (due <= 0) {
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, ((sent / rate) - elapsed) * 1000)))
      continue
    }
    const data = { sent: now() }
    if (due === 1) await boss.send(QUEUE, data)
    else await boss.insert(Array.from({ length: due }, () => ({ name: QUEUE, data })))
    sent += due
  }
  report({ jobs: sent, seconds: (now() - began) / 1000 })
  await boss.stop({ graceful: false, wait: true })
}

const [command, ...rest] = process.argv.slice(2)
const commands = { enqueue, drain, install, fill, 'latency-worker': latencyWorker, 'latency-producer': latencyProducer }
if (!commands[command]) {
  process.stderr.write(`unknown command ${command}; known: ${Object.keys(commands).join(', ')}\n`)
  process.exit(2)
}
// Exits once the command is done: a stdin opened for the start line would keep the process alive.
commands[command](...rest).then(
  () => exit(0),
  (error) => { process.stderr.write(`${error.stack}\n`); exit(1) }
)
