#!/usr/bin/env node
'use strict';

// Drives the real npm client `ali-ons` (pinned in package.json) against a
// RocketMQ name server / broker speaking the classic remoting protocol.
//
// Usage:
//   node roundtrip.js <namesrvAddr> <topic> produce  < messages.json
//   node roundtrip.js <namesrvAddr> <topic> consume <group> <expectedCount> <timeoutMs>
//
// <namesrvAddr> is "host:port" (several may be given separated by ';').
//
// produce: stdin is a JSON array of messages, each
//   { "body": "text" | "bodyB64": "base64", "tags": "TagA", "keys": ["k1", "k2"],
//     "props": { "name": "value" } }
// (all fields optional). Messages are sent one after the other; one JSON line
// per send result is printed to stdout:
//   {"msgId": "...", "queueId": 0, "queueOffset": 0, "status": "SEND_OK"}
// Exit 0 when every message was sent, 1 on the first failure (the error goes to
// stderr), 2 on bad usage / bad input.
//
// consume: subscribes to <topic> with tag expression "*" in CLUSTERING mode and
// CONSUME_FROM_FIRST_OFFSET, and collects messages until <expectedCount>
// distinct messages (distinct by queueId + queueOffset) have arrived. Then it
// closes the consumer (which persists offsets and sends UNREGISTER_CLIENT) and
// prints to stdout one JSON array of
//   {topic, queueId, queueOffset, tags, keys, props, bodyB64, msgId,
//    bornTimestamp, storeTimestamp, sysProps}
// in arrival order. `props` holds user properties only; `sysProps` holds the
// remaining (system) properties as decoded, including MIN_OFFSET / MAX_OFFSET
// which ali-ons itself adds from the pull response header.
// Exit 0 on success; 1 on timeout (what was received is printed as JSON to
// stderr, stdout stays empty) or when the consumer fails to start; 3 when all
// messages arrived (and were printed) but closing the consumer failed or hung.
//
// All ali-ons logging goes to stderr. Set ALIONS_DEBUG=1 to also see its
// info/debug logs. Optional tuning through the environment (milliseconds):
//   ALIONS_POLL_NAMESRV_MS (default 5000; ali-ons default 30000)
//   ALIONS_REBALANCE_MS    (default 5000; ali-ons default 10000)
//   ALIONS_HEARTBEAT_MS    (default 30000)
//   ALIONS_PERSIST_MS      (default 5000)
//   ALIONS_SUSPEND_MS      (broker long-poll suspend, default 15000)
//   ALIONS_PULL_TIMEOUT_MS (client-side pull timeout, default 30000)
//   ALIONS_CLOSE_TIMEOUT_MS (bound on close(), default 10000)
// and ALIONS_PRODUCER_GROUP (default "ALIONS_IT_PRODUCER"),
// ALIONS_CLIENT_IP (only used to build the client id "<ip>@<pid>").

const util = require('util');

// Nothing but our own results may reach stdout.
console.log = console.error;
console.info = console.error;

const VERBOSE = !!process.env.ALIONS_DEBUG;

function stderr(...args) {
  process.stderr.write(util.format(...args) + '\n');
}

const logger = {
  info(...args) { if (VERBOSE) stderr('[ali-ons info]', util.format(...args)); },
  debug(...args) { if (VERBOSE) stderr('[ali-ons debug]', util.format(...args)); },
  warn(...args) { stderr('[ali-ons warn]', util.format(...args)); },
  error(...args) { stderr('[ali-ons error]', util.format(...args)); },
};

function envInt(name, dflt) {
  const v = process.env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) {
    usage(`bad ${name}: ${v}`);
  }
  return n;
}

function usage(msg) {
  if (msg) stderr('roundtrip.js: ' + msg);
  stderr('usage: node roundtrip.js <namesrvAddr> <topic> produce < messages.json');
  stderr('       node roundtrip.js <namesrvAddr> <topic> consume <group> <expectedCount> <timeoutMs>');
  process.exit(2);
}

function writeStdout(text) {
  return new Promise(resolve => process.stdout.write(text, () => resolve()));
}

async function exit(code) {
  // flush both streams before leaving; ali-ons keeps timers alive otherwise
  await new Promise(resolve => process.stderr.write('', () => resolve()));
  await writeStdout('');
  process.exit(code);
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not finish in ${ms}ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

function errText(err) {
  if (!err) return String(err);
  const code = err.code !== undefined ? ` (code ${err.code})` : '';
  return `${err.name || 'Error'}${code}: ${err.message}`;
}

function commonOptions(namesrv) {
  const opts = {
    // a name server list given directly: no Aliyun ONS address lookup
    nameSrv: namesrv.includes(';') ? namesrv.split(';').filter(Boolean) : namesrv,
    // asserted present by ali-ons even when nameSrv is given; never used then
    httpclient: {},
    logger,
    pollNameServerInteval: envInt('ALIONS_POLL_NAMESRV_MS', 5000),
    heartbeatBrokerInterval: envInt('ALIONS_HEARTBEAT_MS', 30000),
    persistConsumerOffsetInterval: envInt('ALIONS_PERSIST_MS', 5000),
    rebalanceInterval: envInt('ALIONS_REBALANCE_MS', 5000),
  };
  if (process.env.ALIONS_CLIENT_IP) {
    opts.clientIP = process.env.ALIONS_CLIENT_IP;
  }
  return opts;
}

const CLOSE_TIMEOUT = envInt('ALIONS_CLOSE_TIMEOUT_MS', 10000);

// ---------------------------------------------------------------------------
// produce

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

async function produce(namesrv, topic) {
  let input;
  try {
    input = JSON.parse(await readStdin());
  } catch (err) {
    usage('stdin is not valid JSON: ' + err.message);
  }
  if (!Array.isArray(input)) usage('stdin must hold a JSON array of messages');

  const { Producer, Message } = require('ali-ons');

  const messages = input.map((m, i) => {
    if (!m || typeof m !== 'object') usage(`message #${i} is not an object`);
    let body;
    if (m.bodyB64 !== undefined && m.bodyB64 !== null) {
      body = Buffer.from(String(m.bodyB64), 'base64');
    } else if (m.body !== undefined && m.body !== null) {
      body = Buffer.from(String(m.body), 'utf8');
    } else {
      body = Buffer.alloc(0);
    }
    const hasTags = m.tags !== undefined && m.tags !== null;
    const msg = new Message(topic, hasTags ? String(m.tags) : null, body);
    if (!hasTags) {
      // ali-ons would otherwise send the property TAGS with the text "null"
      delete msg.properties.TAGS;
    }
    if (m.keys !== undefined && m.keys !== null) {
      const keys = Array.isArray(m.keys) ? m.keys.map(String) : [ String(m.keys) ];
      if (keys.length) msg.keys = keys; // joined with ' ' into property KEYS
    }
    if (m.props) {
      for (const [ k, v ] of Object.entries(m.props)) {
        const s = String(v);
        if (/[\u0001\u0002]/.test(k + s)) {
          usage(`message #${i}: property ${JSON.stringify(k)} holds \\u0001 or \\u0002`);
        }
        msg.properties[k] = s;
      }
    }
    return msg;
  });

  const producer = new Producer(Object.assign(commonOptions(namesrv), {
    producerGroup: process.env.ALIONS_PRODUCER_GROUP || 'ALIONS_IT_PRODUCER',
  }));
  producer.on('error', err => stderr('[roundtrip] producer error:', errText(err)));

  let code = 0;
  try {
    await producer.ready();
    for (const msg of messages) {
      const r = await producer.send(msg);
      await writeStdout(JSON.stringify({
        msgId: r.msgId === undefined ? null : r.msgId,
        queueId: Number(r.messageQueue.queueId),
        queueOffset: r.queueOffset,
        status: r.sendStatus,
      }) + '\n');
    }
  } catch (err) {
    stderr('[roundtrip] produce failed:', errText(err));
    code = 1;
  }

  try {
    await withTimeout(producer.close(), CLOSE_TIMEOUT, 'producer.close()');
  } catch (err) {
    stderr('[roundtrip] closing the producer failed:', errText(err));
    if (code === 0) code = 3;
  }
  await exit(code);
}

// ---------------------------------------------------------------------------
// consume

// properties that are not user properties (RocketMQ MessageConst + ali-ons)
const SYSTEM_PROPS = new Set([
  'TAGS', 'KEYS', 'WAIT', 'DELAY', 'RETRY_TOPIC', 'REAL_TOPIC', 'REAL_QID',
  'TRAN_MSG', 'PGROUP', 'MIN_OFFSET', 'MAX_OFFSET', 'BUYER_ID',
  'ORIGIN_MESSAGE_ID', 'TRANSFER_FLAG', 'CORRECTION_FLAG', 'MQ2_FLAG',
  'RECONSUME_TIME', 'MSG_REGION', 'TRACE_ON', 'UNIQ_KEY', 'MAX_RECONSUME_TIMES',
  'CONSUME_START_TIME', 'CLUSTER', 'TRAN_PREPARED_QUEUE_OFFSET',
  'TRANSACTION_CHECK_TIMES', 'CHECK_IMMUNITY_TIME_IN_SECONDS',
  'INSTANCE_ID', 'CORRELATION_ID', 'REPLY_TO_CLIENT', 'TTL', 'ARRIVE_TIME',
  'PUSH_REPLY_TIME', 'MSG_TYPE', '__STARTDELIVERTIME', '__SHARDING_KEY',
]);

function toRecord(msg) {
  const props = {};
  const sysProps = {};
  for (const [ k, v ] of Object.entries(msg.properties || {})) {
    // ali-ons' decoder always seeds TAGS: null and turns the trailing
    // property separator into an empty '' key; drop both artefacts
    if (k === '' || v === null || v === undefined) continue;
    if (SYSTEM_PROPS.has(k)) {
      sysProps[k] = v;
    } else {
      props[k] = v;
    }
  }
  const keys = msg.properties && msg.properties.KEYS;
  return {
    topic: msg.topic,
    queueId: msg.queueId,
    queueOffset: msg.queueOffset,
    tags: msg.tags === undefined ? null : msg.tags,
    keys: keys ? keys.split(' ').filter(Boolean) : [],
    props,
    bodyB64: msg.body ? Buffer.from(msg.body).toString('base64') : '',
    msgId: msg.msgId,
    bornTimestamp: msg.bornTimestamp,
    storeTimestamp: msg.storeTimestamp,
    sysProps,
  };
}

async function consume(namesrv, topic, group, expectedCount, timeoutMs) {
  const { Consumer } = require('ali-ons');

  const consumer = new Consumer(Object.assign(commonOptions(namesrv), {
    consumerGroup: group,
    isBroadcast: false,
    persistent: false,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    brokerSuspendMaxTimeMillis: envInt('ALIONS_SUSPEND_MS', 15000),
    consumerTimeoutMillisWhenSuspend: envInt('ALIONS_PULL_TIMEOUT_MS', 30000),
  }));
  consumer.on('error', err => stderr('[roundtrip] consumer error:', errText(err)));

  const received = [];
  const seen = new Set();
  let duplicates = 0;
  let finishing = false;

  async function finish(timedOut) {
    if (finishing) return;
    finishing = true;
    clearTimeout(timer);
    let closeErr = null;
    try {
      await withTimeout(consumer.close(), CLOSE_TIMEOUT, 'consumer.close()');
    } catch (err) {
      closeErr = err;
      stderr('[roundtrip] closing the consumer failed:', errText(err));
    }
    if (duplicates) {
      stderr(`[roundtrip] ${duplicates} duplicate deliveries were dropped from the output`);
    }
    if (timedOut) {
      stderr(`[roundtrip] timeout after ${timeoutMs}ms: got ${received.length} of ${expectedCount} messages:`);
      stderr(JSON.stringify(received));
      await exit(1);
      return;
    }
    await writeStdout(JSON.stringify(received) + '\n');
    await exit(closeErr ? 3 : 0);
  }

  const timer = setTimeout(() => { finish(true); }, timeoutMs);

  consumer.subscribe(topic, '*', async msg => {
    if (finishing) return;
    const rec = toRecord(msg);
    // queue ids repeat per broker: the store host names the broker
    const id = `${rec.topic}/${msg.storeHost}/${rec.queueId}/${rec.queueOffset}`;
    if (seen.has(id)) {
      duplicates++;
      stderr(`[roundtrip] duplicate delivery of ${id} (msgId ${rec.msgId})`);
      return;
    }
    seen.add(id);
    received.push(rec);
    if (received.length >= expectedCount) {
      // let ali-ons record the consumed offset (it does so right after this
      // handler resolves) before close() persists offsets to the broker
      setTimeout(() => { finish(false); }, 50);
    }
  });

  try {
    await consumer.ready();
  } catch (err) {
    stderr('[roundtrip] consumer failed to start:', errText(err));
    finishing = true;
    clearTimeout(timer);
    await exit(1);
  }
  if (expectedCount === 0) {
    finish(false);
  }
}

// ---------------------------------------------------------------------------

async function main() {
  const argv = process.argv.slice(2);
  if (argv.length < 3) usage();
  const [ namesrv, topic, mode ] = argv;
  if (!/^[^:;\s]+:\d+(;[^:;\s]+:\d+)*;?$/.test(namesrv)) usage(`bad namesrvAddr: ${namesrv}`);
  if (!topic) usage('empty topic');
  if (mode === 'produce') {
    if (argv.length !== 3) usage();
    await produce(namesrv, topic);
  } else if (mode === 'consume') {
    if (argv.length !== 6) usage();
    const group = argv[3];
    const expectedCount = Number(argv[4]);
    const timeoutMs = Number(argv[5]);
    if (!group) usage('empty group');
    if (!Number.isInteger(expectedCount) || expectedCount < 0) usage(`bad expectedCount: ${argv[4]}`);
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage(`bad timeoutMs: ${argv[5]}`);
    await consume(namesrv, topic, group, expectedCount, timeoutMs);
  } else {
    usage(`unknown mode: ${mode}`);
  }
}

process.on('unhandledRejection', err => {
  stderr('[roundtrip] unhandled rejection:', err && err.stack ? err.stack : err);
});

main().catch(async err => {
  stderr('[roundtrip] fatal:', err && err.stack ? err.stack : err);
  await exit(1);
});
