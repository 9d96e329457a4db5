// Starts azurite-blob with the given arguments and stops it when our stdin closes, so an
// Azurite started by a test process never outlives that process (even if it is killed).
"use strict";
const { spawn } = require("child_process");
const path = require("path");

const bin = path.join(__dirname, "node_modules", "azurite", "dist", "src", "blob", "main.js");
const child = spawn(process.execPath, [bin, ...process.argv.slice(2)], { stdio: ["ignore", "inherit", "inherit"] });
const stop = () => { child.kill("SIGTERM"); setTimeout(() => process.exit(0), 2000).unref(); };
process.stdin.on("end", stop);
process.stdin.on("error", stop);
process.stdin.resume();
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
child.on("exit", (code) => {
  // A test's temporary data folder goes with its Azurite.
  const tmp = process.env.LEASEGATE_AZURITE_TMP;
  if (tmp) { require("fs").rmSync(tmp, { recursive: true, force: true }); }
  process.exit(code === null ? 1 : code);
});
