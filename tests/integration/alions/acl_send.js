#!/usr/bin/env node
'use strict';

// Sends messages with the npm client ali-ons *signing its requests* (accessKey/secretKey), to
// check that a broker with ACL on accepts a third-party signer's signatures.
//
// Usage: ALIONS_ACCESS_KEY=.. ALIONS_SECRET_KEY=.. node acl_send.js <namesrvAddr> <topic> <count>
// (keys come from the environment so that they stay out of `ps`).
// Prints one JSON line per send result {"queueId", "queueOffset", "status"}; exit 0 when every
// message was sent, 1 on the first failure (the error goes to stderr), 2 on bad usage.

console.log = console.error;
console.info = console.error;

const logger = {
  info() {}, debug() {}, log() {},
  warn(...a) { process.stderr.write(a.join(' ') + '\n'); },
  error(...a) { process.stderr.write(a.map(x => (x && x.stack) || String(x)).join(' ') + '\n'); },
};

async function main() {
  const [ namesrv, topic, countText ] = process.argv.slice(2);
  const count = Number(countText);
  const accessKey = process.env.ALIONS_ACCESS_KEY;
  const secretKey = process.env.ALIONS_SECRET_KEY;
  if (!namesrv || !topic || !Number.isInteger(count) || count < 1 || !accessKey || !secretKey) {
    process.stderr.write('usage: ALIONS_ACCESS_KEY=.. ALIONS_SECRET_KEY=.. node acl_send.js NAMESRV TOPIC COUNT\n');
    process.exit(2);
  }
  const { Producer, Message } = require('ali-ons');
  const producer = new Producer({
    nameSrv: namesrv,
    httpclient: {}, // asserted present by ali-ons; unused with nameSrv
    logger,
    accessKey,
    secretKey,
    producerGroup: 'ALIONS_ACL_PRODUCER',
    pollNameServerInteval: 1000,
  });
  producer.on('error', err => process.stderr.write('producer error: ' + err.message + '\n'));
  let code = 0;
  try {
    await producer.ready();
    for (let i = 0; i < count; i++) {
      const r = await producer.send(new Message(topic, 'acl', Buffer.from('alions-acl-' + i)));
      process.stdout.write(JSON.stringify({
        queueId: Number(r.messageQueue.queueId), queueOffset: r.queueOffset, status: r.sendStatus,
      }) + '\n');
    }
  } catch (err) {
    process.stderr.write('send failed: ' + (err.name || 'Error') + ': ' + err.message + '\n');
    code = 1;
  }
  await Promise.race([ producer.close(), new Promise(r => setTimeout(r, 5000)) ]);
  process.exit(code);
}

main();
