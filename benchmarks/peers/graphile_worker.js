// graphile-worker's side of the benchmarks.
//
// `node graphile_worker.js enqueue DSN batch|one PAYLOADS.json`: batch is `addJobs` (one call, one statement),
// one at a time is `addJob` awaited job after job, both through WorkerUtils on its own pool, the schema
// migrated before the clock starts.
//
// `node graphile_worker.js drain DSN SETTING.json`: `run()` with the settings of its docs' performance page
// (concurrentJobs 24, localQueue of 500, completeJobBatchDelay and failJobBatchDelay 0; the setting gives
// concurrentJobs and the localQueue size), but for maxPoolSize: its default, 10, rather than the page's 25,
// which at 8 processes would ask for 200 connections of a server that allows 100. The local queue fetches in
// batches, so the jobs do not wait for connections. The pool's connections are opened before the start. It
// has no burst mode: the driver stops the runner once its jobs table is empty (graphile-worker deletes a job
// when it completes), which it checks every 20 ms on a connection of its own.
'use strict'
const { load, version, payloads, report, exit, seconds, ready, cpuSeconds } = require('./node_common')
const { makeWorkerUtils, run } = load('graphile-worker')
const { Pool } = load('pg')

const EMPTY_CHECK_MS = 20
const POOL_SIZE = 10

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

function preset (setting) {
  return {
    worker: {
      concurrentJobs: setting.jobs,
      maxPoolSize: POOL_SIZE,
      localQueue: { size: setting.local_queue },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
      pollInterval: 2000
    }
  }
}

async function openPool (dsn, size) {
  const pool = new Pool({ connectionString: dsn, max: size })
  pool.on('error', (error) => process.stderr.write(`${error.stack}\n`))
  pool.on('connect', (client) => client.on('error', (error) => process.stderr.write(`${error.stack}\n`)))
  const clients = await Promise.all(Array.from({ length: size }, () => pool.connect()))
  for (const client of clients) client.release()
  return pool
}

async function drain (dsn, settingJson) {
  const setting = JSON.parse(settingJson)
  const options = preset(setting)
  const pool = await openPool(dsn, options.worker.maxPoolSize)
  const watcher = new Pool({ connectionString: dsn, max: 1 })
  await watcher.query('SELECT 1')
  let done = 0
  const taskList = { noop: async () => { done += 1 } }
  const logger = new (load('@graphile/logger').Logger)(() => () => {})
  await ready()
  const cpu = process.cpuUsage()
  const runner = await run({ pgPool: pool, taskList, noHandleSignals: true, logger, preset: options })
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, EMPTY_CHECK_MS))
    const left = await watcher.query('SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS any')
    if (!left.rows[0].any) break
  }
  report({ done, cpu_seconds: cpuSeconds(cpu), version: version('graphile-worker') })
  await runner.stop()
  await watcher.end()
  await pool.end()
}

async function install (dsn) {
  const utils = await makeWorkerUtils({ connectionString: dsn })
  await utils.migrate()
  await utils.release()
  report({ version: version('graphile-worker') })
}

async function fill (dsn, file) {
  const utils = await makeWorkerUtils({ connectionString: dsn })
  await utils.withPgClient((client) => client.query('DELETE FROM graphile_worker._private_jobs'))
  const jobs = payloads(file)
  for (let first = 0; first < jobs.length; first += 5000) {
    await utils.addJobs(jobs.slice(first, first + 5000).map((payload) => ({ identifier: 'noop', payload })))
  }
  await utils.withPgClient((client) => client.query('VACUUM ANALYZE graphile_worker._private_jobs'))
  await utils.release()
  report({ jobs: jobs.length })
}

// Wall-clock milliseconds with sub-millisecond precision, comparable between processes (and with Python's
// time.time() * 1000).
function now () {
  return performance.timeOrigin + performance.now()
}

// `latency-worker DSN TOTAL`: a running (not burst) worker with the performance settings, woken by
// LISTEN/NOTIFY, until TOTAL jobs have started; prints each job's wait from its `sent` time to its start.
async function latencyWorker (dsn, total) {
  const options = preset({ jobs: 24, local_queue: 500 })
  const pool = await openPool(dsn, options.worker.maxPoolSize)
  const waits = []
  let finished
  const allStarted = new Promise((resolve) => { finished = resolve })
  const taskList = {
    stamp: async (payload) => {
      waits.push(now() - payload.sent)
      if (waits.length === Number(total)) finished()
    }
  }
  const logger = new (load('@graphile/logger').Logger)(() => () => {})
  const runner = await run({ pgPool: pool, taskList, noHandleSignals: true, logger, preset: options })
  await ready()
  await allStarted
  await new Promise((resolve) => setTimeout(resolve, 500))
  report({ waits, version: version('graphile-worker') })
  await runner.stop()
  await pool.end()
}

// `latency-producer DSN RATE TOTAL`: job n is due at n / RATE seconds; the jobs that have come due go in
// with one `addJobs` (one `addJob` when one is due), each carrying the time just before the call.
async function latencyProducer (dsn, rate, total) {
  const utils = await makeWorkerUtils({ connectionString: dsn })
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
    const payload = { sent: now() }
    if (due === 1) await utils.addJob('stamp', payload)
    else await utils.addJobs(Array.from({ length: due }, () => ({ identifier: 'stamp', payload })))
    sent += due
  }
  report({ jobs: sent, seconds: (now() - began) / 1000 })
  await utils.release()
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
