// What the Node peers' drivers share: the packages from benchmarks/node_peers (installed by scripts/lib/node.sh),
// the payloads the Python side wrote, and one JSON line of results on stdout.
'use strict'
const fs = require('fs')
const path = require('path')
const { createRequire } = require('module')

const FOLDER = process.env.DIBS_NODE_PEERS || path.join(__dirname, '..', 'node_peers')
const load = createRequire(path.join(FOLDER, 'package.json'))

function version (name) {
  return load(`${name}/package.json`).version
}

function payloads (file) {
  return JSON.parse(fs.readFileSync(file, 'utf8'))
}

function report (result) {
  process.stdout.write(JSON.stringify({ ...result, node: process.versions.node }) + '\n')
}

// Exits once stdout has taken every line written: process.exit() alone drops what a pipe has not taken
// yet, which cut a latency worker's result line at 64 KiB.
function exit (code) {
  process.stdout.write('', () => process.exit(code))
}

function seconds (began) {
  return Number(process.hrtime.bigint() - began) / 1e9
}

// A drain waits, connections open, until the parent passes the start barrier and writes a line.
function ready () {
  report({ ready: true })
  return new Promise((resolve) => process.stdin.once('data', () => resolve()))
}

function cpuSeconds (since) {
  const used = process.cpuUsage(since)
  return (used.user + used.system) / 1e6
}

module.exports = { load, version, payloads, report, exit, seconds, ready, cpuSeconds }
