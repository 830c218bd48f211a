// Bundle the web dApp into dapp/dist/ with esbuild: app.js (our code + ethers), index.html and
// styles.css. `npm run build:dapp`; the gateway serves dapp/dist (node/gateway/dapp.py).
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "dist");
rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });
await build({
  entryPoints: [join(here, "src", "main.js")],
  outfile: join(dist, "app.js"),
  bundle: true,
  format: "esm",
  minify: true,
  sourcemap: "linked",
  target: ["chrome110", "firefox115", "safari16"],
  legalComments: "linked",
  logLevel: "warning",
});
for (const name of ["index.html", "styles.css"]) copyFileSync(join(here, name), join(dist, name));
console.log(`dApp built into ${dist}`);
