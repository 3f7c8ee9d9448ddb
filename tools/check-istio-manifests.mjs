// Checks Kubernetes manifests of Istio kinds against the CRDs' OpenAPI schemas, as packaged in
// the npm package @kubernetes-models/istio (`./build.sh deploy-check` installs it).
//
//   node tools/check-istio-manifests.mjs <node_modules dir> <file.yaml>...
//
// Every document must be of a kind the package knows; a document that fails its schema prints
// the validation errors and makes the exit status 1.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, ...files] = process.argv.slice(2);
if (!modules || files.length === 0) {
  console.error("usage: check-istio-manifests.mjs <node_modules dir> <file.yaml>...");
  process.exit(2);
}
const load = (p) => import(pathToFileURL(join(modules, p)).href);
const yaml = await load("js-yaml/dist/js-yaml.mjs");
let bad = 0;
let checked = 0;
for (const file of files) {
  for (const doc of yaml.loadAll(readFileSync(file, "utf8"))) {
    if (!doc) continue;
    const [group, version] = doc.apiVersion.split("/");
    const where = `${file}: ${doc.kind} ${doc.metadata?.namespace}/${doc.metadata?.name}`;
    let Kind;
    try {
      Kind = (await load(`@kubernetes-models/istio/${group}/${version}/${doc.kind}.js`))[doc.kind];
    } catch (e) {
      console.error(`${where}: no schema for ${doc.apiVersion} ${doc.kind}: ${e.message}`);
      bad++;
      continue;
    }
    try {
      new Kind(doc).validate();
      console.log(`${where}: matches the ${doc.apiVersion} ${doc.kind} schema`);
      checked++;
    } catch (e) {
      console.error(`${where}: ${e.message}`);
      bad++;
    }
  }
}
console.log(`${checked} manifest(s) match, ${bad} do not`);
process.exit(bad ? 1 : 0);
