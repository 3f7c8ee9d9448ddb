// Cargo runner for wasm32-wasip1 test binaries: runs a .wasm under Node's
// built-in WASI (preview1) and exits with its exit code.
//   CARGO_TARGET_WASM32_WASIP1_RUNNER="node tools/wasi-run.mjs" \
//     cargo test -p prefix-router-core --target wasm32-wasip1
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env, exit } from 'node:process';

const [, , wasmPath, ...args] = argv;
const wasi = new WASI({
  version: 'preview1',
  args: [wasmPath, ...args],
  env: { RUST_BACKTRACE: env.RUST_BACKTRACE ?? '0' },
  preopens: {},
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(wasmPath));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance) ?? 0);
