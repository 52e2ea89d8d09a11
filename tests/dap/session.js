// tests/dap/session.js SHMAP [RUNS] - `shmap --dap` driven by VS Code's own
// test client (DebugClient, @vscode/debugadapter-testsupport) through
// program.shm on 8 devices: a breakpoint in the shard_map body stops every
// thread (device); the stacks and variables of two devices; evaluation on
// every device and of a collective; a step; a conditional breakpoint that
// holds on one device only, a log point and setVariable there; a
// breakpoint() in a jit function; errors where they are raised (caught or
// not); the uncaught error (post-mortem) and its pytree; terminate.  Then
// loop.shm: function breakpoints, hit conditions, pause, restart, terminate
// while the program runs; and bad requests, refused.  The sessions run
// RUNS times (default 10): every run must give the same events and values.
'use strict';
const assert = require('assert');
const path = require('path');
const { DebugClient } = require('@vscode/debugadapter-testsupport');

const shmap = path.resolve(process.argv[2]);
const runs = Number(process.argv[3] || 10);
const program = path.join(__dirname, 'program.shm');
const EVENTS = ['initialized', 'stopped', 'continued', 'thread', 'output', 'exited', 'terminated'];
// a sanitizer build runs slower: the client's waits grow by its factor (run-tests.sh)
const scale = Number(process.env.SHMAP_TEST_SCALE || 1);

// The value of variable [name] among [vars].
function value(vars, name) {
  const v = vars.find((x) => x.name === name);
  assert.ok(v, `no variable ${name} in ${JSON.stringify(vars.map((x) => x.name))}`);
  return v;
}

async function variables(dc, ref, extra) {
  return (await dc.variablesRequest({ variablesReference: ref, ...extra })).body.variables;
}

// The Locals, Globals and Device scopes of thread [tid]'s top frame, and
// that frame.
async function top(dc, tid) {
  const frames = (await dc.stackTraceRequest({ threadId: tid })).body.stackFrames;
  const scopes = (await dc.scopesRequest({ frameId: frames[0].id })).body.scopes;
  return { frames, scope: (name) => scopes.find((s) => s.name.startsWith(name)) };
}

// Sends [request] and waits for the `stopped` event it leads to.
async function resumeTo(dc, request) {
  const [, stopped] = await Promise.all([request, dc.waitForEvent('stopped')]);
  return stopped.body;
}

// Starts the adapter and initializes it, every event going into [log].
async function connect(log) {
  const dc = new DebugClient(shmap, '--dap', 'shmap');
  dc.defaultTimeout = 5000 * scale;
  for (const e of EVENTS) dc.on(e, (ev) => log.push({ event: e, body: ev.body }));
  await dc.start();
  await dc.initializeRequest();
  return dc;
}

// connect, then launch [launchArgs]; the client once the adapter asks for
// its configuration.
async function launch(launchArgs, log) {
  const dc = await connect(log);
  const initialized = dc.waitForEvent('initialized');
  await dc.launchRequest(launchArgs);
  await initialized;
  return dc;
}

// Ends the program (terminate), then the session; shmap --dap must then
// exit by itself with the program's status, as the `exited` event said
// (a sanitizer's report, such as a leak, changes the status: run-tests.sh).
async function terminate(dc) {
  const ended = dc.waitForEvent('terminated');
  const exited = dc.waitForEvent('exited');
  await dc.terminateRequest();
  await ended;
  const adapter = dc._adapterProcess;   // the DebugClient's child; no accessor of its own
  const status = new Promise((resolve) => adapter.once('exit', (code, signal) => resolve(code ?? signal)));
  await dc.disconnectRequest();
  assert.strictEqual(await status, (await exited).body.exitCode);
}

async function session() {
  const log = [];
  const seen = [];   // values looked at, compared between runs too
  const dc = await launch({ program, devices: 8 }, log);
  try {
    // a breakpoint in the body: every device stops there, one stop
    const bps = await dc.setBreakpointsRequest({ source: { path: program }, breakpoints: [{ line: 6 }] });
    assert.deepStrictEqual(bps.body.breakpoints.map((b) => [b.verified, b.line]), [[true, 6]]);
    await dc.setExceptionBreakpointsRequest({ filters: ['uncaught'] });
    let stop = await resumeTo(dc, dc.configurationDoneRequest());
    assert.strictEqual(stop.reason, 'breakpoint');
    assert.strictEqual(stop.allThreadsStopped, true);
    assert.strictEqual(stop.threadId, 1000);
    const threads = (await dc.threadsRequest()).body.threads;
    assert.deepStrictEqual(threads.map((t) => t.name), [0, 1, 2, 3, 4, 5, 6, 7].map((i) => `(i=${i})`));

    // two devices' stacks and variables
    for (const [tid, y] of [[1000, '1.'], [1003, '7.']]) {
      const t = await top(dc, tid);
      assert.deepStrictEqual(t.frames.map((f) => [f.name, f.line]), [['body', 6], ['<module>', 10]]);
      const locals = await variables(dc, t.scope('Locals').variablesReference);
      const yv = value(locals, 'y');
      assert.strictEqual(yv.value, `Array([${y}], dtype=float32)`);
      assert.strictEqual(yv.type, 'float32[1]');
      const named = await variables(dc, yv.variablesReference, { filter: 'named' });
      assert.strictEqual(value(named, 'shape').value, '(1,)');
      assert.strictEqual(value(named, 'sharding').value, `block of (i=${tid - 1000}), varying over {'i'}`);
      const rows = await variables(dc, yv.variablesReference, { filter: 'indexed', start: 0, count: 1 });
      assert.strictEqual(rows[0].value, `Array(${y}, dtype=float32)`);
      const device = await variables(dc, t.scope('Device').variablesReference);
      assert.strictEqual(value(device, "axis_index('i')").value, `${tid - 1000} of 8`);
      seen.push(locals, device);
    }

    // evaluation on every device, and a collective typed at the stop
    const t3 = await top(dc, 1003);
    const all = await dc.evaluateRequest({ expression: 'y @ all', frameId: t3.frames[0].id, context: 'watch' });
    assert.strictEqual(all.body.result.split('\n').length, 8);
    assert.match(all.body.result, /^\(i=7\): Array\(\[15\.\], dtype=float32\)$/m);
    const ps = await dc.evaluateRequest({ expression: "psum(y, 'i')", frameId: t3.frames[0].id, context: 'watch' });
    assert.strictEqual(ps.body.result, 'Array([64.], dtype=float32)');
    // in the debug console, a line as typed at the terminal debugger's prompt
    const repl = await dc.evaluateRequest({ expression: "psum(y, 'i') + y", frameId: t3.frames[0].id, context: 'repl' });
    assert.match(repl.body.result, /^\(i=3\): Array\(\[71\.\], dtype=float32\)$/m);
    seen.push(all.body, ps.body, repl.body);

    // a step moves every device one statement
    stop = await resumeTo(dc, dc.nextRequest({ threadId: 1003 }));
    assert.strictEqual(stop.reason, 'step');
    const s3 = await top(dc, 1003);
    assert.strictEqual(s3.frames[0].line, 7);
    const sv = await dc.evaluateRequest({ expression: 's', frameId: s3.frames[0].id, context: 'hover' });
    assert.strictEqual(sv.body.result, 'Array([64.], dtype=float32)');

    // a breakpoint whose condition holds on device (i=3) only, in the
    // second call; a log point on every device; then setVariable there
    await dc.setBreakpointsRequest({
      source: { path: program },
      breakpoints: [{ line: 5, logMessage: 'x is {x[0]}, {{x}}' }, { line: 7, condition: 'y[0] == 27.' }],
    });
    stop = await resumeTo(dc, dc.continueRequest({ threadId: 1003 }));
    assert.strictEqual(stop.reason, 'breakpoint');
    assert.strictEqual(stop.threadId, 1003);
    const c3 = await top(dc, 1003);
    assert.strictEqual(c3.frames[0].line, 7);
    const set = await dc.setVariableRequest({
      variablesReference: c3.scope('Locals').variablesReference, name: 'y', value: 'y + 100',
    });
    assert.strictEqual(set.body.value, 'Array([127.], dtype=float32)');

    // breakpoint() in a jit function: its frame with concrete values
    stop = await resumeTo(dc, dc.continueRequest({ threadId: 1003 }));
    assert.strictEqual(stop.reason, 'breakpoint');
    assert.strictEqual(stop.threadId, 1);
    const j = await top(dc, 1);
    assert.deepStrictEqual(j.frames.map((f) => [f.name, f.line]), [['h', 15], ['<module>', 17]]);
    const jl = await variables(dc, j.scope('Locals').variablesReference);
    assert.strictEqual(value(jl, 'w').value, 'Array([0., 3.], dtype=float32)');
    seen.push(jl);

    // the "raised" filter: a stop where an error is raised, caught or not;
    // the program goes on from a line typed in the debug console
    // (`continued`)
    await dc.setExceptionBreakpointsRequest({ filters: ['uncaught', 'raised'] });
    const cont = dc.waitForEvent('continued');
    stop = await resumeTo(dc, dc.evaluateRequest({ expression: 'c', frameId: j.frames[0].id, context: 'repl' }));
    assert.strictEqual((await cont).body.allThreadsContinued, true);
    assert.deepStrictEqual([stop.reason, stop.description, stop.text],
                           ['exception', 'Error raised', 'list index out of range']);
    assert.strictEqual((await top(dc, 1)).frames[0].line, 19);
    stop = await resumeTo(dc, dc.continueRequest({ threadId: 1 }));
    assert.deepStrictEqual([stop.reason, stop.description], ['exception', 'Error raised']);
    assert.strictEqual((await top(dc, 1)).frames[0].line, 23);

    // the uncaught error: post-mortem, where it was raised
    stop = await resumeTo(dc, dc.continueRequest({ threadId: 1 }));
    assert.strictEqual(stop.reason, 'exception');
    assert.strictEqual(stop.description, 'Uncaught error');
    assert.match(stop.text, /KeyError: 'b'/);
    assert.strictEqual(stop.threadId, 1);
    const pm = await top(dc, 1);
    assert.deepStrictEqual(pm.frames.map((f) => [f.name, f.line]), [['<module>', 23]]);
    const globals = await variables(dc, pm.scope('Globals').variablesReference);
    const tree = await variables(dc, value(globals, 't').variablesReference);
    assert.deepStrictEqual(tree.map((v) => v.name), ['[0]', '[1]', '[2]']);
    const dict = await variables(dc, tree[2].variablesReference);
    assert.deepStrictEqual(dict.map((v) => [v.name, v.type]), [["'a'", 'float32[3]']]);
    // a long value is cut to 400 characters, between characters
    const long = await dc.evaluateRequest({ expression: "'\u00e9' * 500", frameId: pm.frames[0].id, context: 'watch' });
    assert.strictEqual([...long.body.result].length, 400);
    assert.ok(long.body.result.startsWith("'\u00e9\u00e9") && long.body.result.endsWith('\u00e9...'));
    const a = await variables(dc, dict[0].variablesReference, { filter: 'named' });
    assert.strictEqual(value(a, 'sharding').value, 'the whole array, on no device of a mesh');
    seen.push(tree, dict);

    // terminate: the program ends, with the error's status
    await terminate(dc);
  } finally {
    dc.stopAdapter();
  }
  const out = log.filter((e) => e.event === 'output').map((e) => e.body.output).join('');
  assert.match(out, /^\(i=3\): x is 13\.0, {x}$/m);
  assert.match(out, /^\[245\. 247\. 249\. 351\. 253\. 255\. 257\. 259\.\]$/m);
  const exited = log.find((e) => e.event === 'exited');
  assert.strictEqual(exited.body.exitCode, 1);
  return JSON.stringify({ log, seen });
}

// The second session, on loop.shm: a function breakpoint with a hit
// condition, stepOut to its return, pause, a breakpoint with a hit
// condition across a restart, stepIn, the program's arguments, terminate
// while the program runs.
async function loopSession() {
  const log = [];
  const seen = [];
  const loop = path.join(__dirname, 'loop.shm');
  const dc = await launch({ program: loop, args: ['-x', 'two words'] }, log);
  try {
    const fb = await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'tick', hitCondition: '== 3' }, { name: 'tock' }] });
    assert.deepStrictEqual(fb.body.breakpoints.map((b) => [b.verified, b.line]), [[true, 4], [false, undefined]]);
    let stop = await resumeTo(dc, dc.configurationDoneRequest());
    assert.strictEqual(stop.reason, 'function breakpoint');
    const t = await top(dc, 1);
    assert.deepStrictEqual(t.frames.map((f) => [f.name, f.line]), [['tick', 4], ['<module>', 7]]);
    const k = await dc.evaluateRequest({ expression: 'k', frameId: t.frames[0].id, context: 'hover' });
    assert.strictEqual(k.body.result, '2');
    seen.push(k.body);

    // stepOut stops as tick returns (pdb's --Return--), its value shown
    stop = await resumeTo(dc, dc.stepOutRequest({ threadId: 1 }));
    assert.strictEqual(stop.reason, 'step');
    const out = await top(dc, 1);
    assert.deepStrictEqual(out.frames.map((f) => [f.name, f.line]), [['tick', 4], ['<module>', 7]]);
    const ret = await variables(dc, out.scope('Locals').variablesReference);
    assert.deepStrictEqual(ret.map((v) => [v.name, v.value]), [['__return__', '3'], ['k', '2']]);

    // pause: where it stops is the loop's, not checked
    await dc.setFunctionBreakpointsRequest({ breakpoints: [] });
    await dc.continueRequest({ threadId: 1 });
    stop = await resumeTo(dc, dc.pauseRequest({ threadId: 1 }));
    assert.strictEqual(stop.reason, 'pause');

    // restart, with a breakpoint stopping at the 50th crossing where its
    // condition holds (the hit condition counts those only): n is 98
    await dc.setBreakpointsRequest({
      source: { path: loop }, breakpoints: [{ line: 7, condition: 'n % 2 == 0', hitCondition: '== 50' }],
    });
    stop = await resumeTo(dc, dc.restartRequest({}));
    assert.strictEqual(stop.reason, 'breakpoint');
    const r = await top(dc, 1);
    const n = await dc.evaluateRequest({ expression: 'n', frameId: r.frames[0].id, context: 'watch' });
    assert.strictEqual(n.body.result, '98');
    seen.push(n.body);

    // stepIn goes into tick; the launch's args are its argv[1:]
    stop = await resumeTo(dc, dc.stepInRequest({ threadId: 1 }));
    assert.strictEqual(stop.reason, 'step');
    const inside = await top(dc, 1);
    assert.deepStrictEqual(inside.frames.map((f) => [f.name, f.line]), [['tick', 4], ['<module>', 7]]);
    const argv = await dc.evaluateRequest({ expression: 'argv[1:]', frameId: inside.frames[0].id, context: 'watch' });
    assert.strictEqual(argv.body.result, "['-x', 'two words']");

    // terminate while it runs
    await dc.continueRequest({ threadId: 1 });
    await terminate(dc);
  } finally {
    dc.stopAdapter();
  }
  assert.ok(log.some((e) => e.event === 'exited'));
  return JSON.stringify({ log, seen });
}

// The third session: bad requests are refused, saying why, and the
// session goes on: a launch of a missing program or with bad `devices`;
// breakpoints with a condition that does not parse, a malformed hit
// condition, on a line with no statement at or after it; a request the
// adapter does not support; a frame that does not exist.
async function errorSession() {
  const log = [];
  const loop = path.join(__dirname, 'loop.shm');
  const dc = await connect(log);
  try {
    await assert.rejects(dc.launchRequest({ program: path.join(__dirname, 'missing.shm') }),
                         /the program is not found/);
    await assert.rejects(dc.launchRequest({ program: loop, devices: 0 }), /'devices' must be an integer from 1/);
    const initialized = dc.waitForEvent('initialized');
    await dc.launchRequest({ program: loop, stopOnEntry: true });
    await initialized;
    const bps = await dc.setBreakpointsRequest({
      source: { path: loop },
      breakpoints: [{ line: 4, condition: 'k +' }, { line: 4, hitCondition: 'often' }, { line: 99 }, { line: 1 },
                    { line: 4, logMessage: 'x'.repeat(256) }],
    });
    assert.deepStrictEqual(bps.body.breakpoints.map((b) => [b.verified, b.line, b.message]), [
      [false, undefined, "condition 'k +': invalid syntax"],
      [false, undefined, "hit condition 'often': expected N, == N, >= N, > N, <= N, < N or % N"],
      [false, undefined, 'no statement at or after this line'],
      [true, 3, undefined],   // the comment's line moves to the def's
      [false, undefined, 'a condition or log message has at most 255 bytes'],
    ]);
    const stop = await resumeTo(dc, dc.configurationDoneRequest());
    assert.strictEqual(stop.reason, 'entry');
    await assert.rejects(dc.gotoRequest({ threadId: 1, targetId: 1 }), /'goto' is not supported/);
    await assert.rejects(dc.scopesRequest({ frameId: 12345 }), /no such frame/);
    await assert.rejects(dc.evaluateRequest({ expression: 'nothing_here', context: 'watch' }),
                         /name 'nothing_here' is not defined/);
    await terminate(dc);
  } finally {
    dc.stopAdapter();
  }
  return JSON.stringify(log);
}

// A session whose adapter died leaves nothing for node to wait on: node
// would end, status 0, in the middle of it.  That is a failure.
let finished = false;
process.on('exit', (code) => {
  if (finished || code !== 0) return;
  console.error('FAIL tests/dap/session.js: a session stopped half-way (did shmap --dap exit?)');
  process.exitCode = 1;
});

(async () => {
  let first = null;
  for (let run = 1; run <= runs; run++) {
    const got = await session() + await loopSession() + await errorSession();
    if (first === null) first = got;
    else assert.strictEqual(got, first, `run ${run} differs from run 1`);
  }
  finished = true;
  console.log(`PASS tests/dap/session.js: ${runs} runs, the same events and values`);
})().catch((e) => {
  console.error(`FAIL tests/dap/session.js: ${e.stack || e}`);
  process.exit(1);
});
