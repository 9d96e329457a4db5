// Starts azurite-blob (or azurite-table, with LEASEGATE_AZURITE_SERVICE=table) with the given
// arguments and stops it when our stdin closes, so an Azurite started by a test process never
// outlives that process (even if it is killed).
"use strict";
const { spawn } = require("child_process");
const path = require("path");

const service = process.env.LEASEGATE_AZURITE_SERVICE || "blob";
if (service !== "blob" && service !== "table") {
  console.error(`LEASEGATE_AZURITE_SERVICE must be blob or table, not ${service}`);
  process.exit(2);
}
const bin = path.join(__dirname, "node_modules", "azurite", "dist", "src", service, "main.js");
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
