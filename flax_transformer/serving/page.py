"""The page at `/`: type or paste sentences (one per line), see their translations.

Beam and alpha start empty, their placeholders the server's defaults (from /health):
a request carries only what the user set, so it runs the server's warmed search. The
source and target pickers list what GET /languages does (each source, then its
targets; 'auto' detects the source); a model that states no languages shows none.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>flax-transformer</title>
<style>
  body { font-family: sans-serif; max-width: 50em; margin: 2em auto; padding: 0 1em; }
  textarea { width: 100%; font-size: 1em; }
  #translations li { margin: 0.3em 0; }
  #error { color: #b00; }
  .meta { color: #666; font-size: 0.9em; }
</style>
</head>
<body>
<h1>Translate</h1>
<p class="meta" id="model"></p>
<form id="form">
  <textarea id="source" rows="6" placeholder="One sentence per line"></textarea>
  <p id="languages">
    <label>From <select id="source_lang"></select></label>
    <label>To <select id="target_lang"></select></label>
  </p>
  <p>
    <label>Beam <input id="beam_size" type="number" min="1" style="width:4em"></label>
    <label>Alpha <input id="alpha" type="number" step="0.1" min="0" style="width:4em"></label>
    <label id="token_label">Token <input id="token" type="password"></label>
    <button id="translate" type="submit">Translate</button>
  </p>
</form>
<p id="error"></p>
<ol id="translations"></ol>
<script>
const $ = (id) => document.getElementById(id);
$("token").value = localStorage.getItem("token") || "";

function headers() {
  const h = {"Content-Type": "application/json"};
  const token = $("token").value;
  if (token) { h["Authorization"] = "Bearer " + token; localStorage.setItem("token", token); }
  return h;
}

async function showModel() {
  const r = await fetch("/health", {headers: headers()});
  if (!r.ok) return;
  const h = await r.json();
  $("model").textContent = "Model: " + h.model.workdir + ", steps averaged " +
      JSON.stringify(h.steps_averaged);
  $("beam_size").placeholder = h.search.beam_size;
  $("alpha").placeholder = h.search.alpha;
}

let targetsOf = {};
function option(select, code, name) {
  const o = document.createElement("option");
  o.value = code;
  o.textContent = name;
  select.appendChild(o);
}
function showTargets() {
  const source = $("source_lang").value, picked = $("target_lang").value;
  const all = [...new Set(Object.values(targetsOf).flat().map(JSON.stringify))];
  const codes = source === "auto" ? all.map((t) => JSON.parse(t)) : targetsOf[source] || [];
  $("target_lang").replaceChildren();
  for (const [code, name] of codes) option($("target_lang"), code, name);
  if (codes.some(([code]) => code === picked)) $("target_lang").value = picked;
}
async function showLanguages() {
  const r = await fetch("/languages");
  const languages = r.ok ? await r.json() : [];
  const names = Object.fromEntries(languages.map((l) => [l.code, l.name]));
  const sources = languages.filter((l) => l.targets.length);
  targetsOf = Object.fromEntries(sources.map(
      (l) => [l.code, l.targets.map((t) => [t, names[t] || t])]));
  $("languages").hidden = !sources.length;
  $("source_lang").replaceChildren();
  if (sources.length > 1) option($("source_lang"), "auto", "Detect");
  for (const l of sources) option($("source_lang"), l.code, l.name);
  showTargets();
}
$("source_lang").addEventListener("change", showTargets);

$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("error").textContent = "";
  $("translations").replaceChildren();
  const text = $("source").value.split("\\n").filter((line) => line.trim());
  const body = {text};
  if (!$("languages").hidden) {  // The pair picked (a model of one pair: its only one).
    body.source_lang = $("source_lang").value;
    body.target_lang = $("target_lang").value;
  }
  for (const field of ["beam_size", "alpha"]) {  // Only those set: else the server's default.
    if ($(field).value !== "") body[field] = Number($(field).value);
  }
  try {
    const r = await fetch("/translate", {method: "POST", headers: headers(),
                                        body: JSON.stringify(body)});
    const answer = await r.json();
    if (!r.ok) { $("error").textContent = answer.error; return; }
    for (const translation of answer.translations) {
      const li = document.createElement("li");
      li.textContent = translation;
      $("translations").appendChild(li);
    }
    $("translations").dataset.done = "1";
  } catch (e) {
    $("error").textContent = String(e);
  }
});
$("token").addEventListener("change", showModel);
showModel();
showLanguages();
</script>
</body>
</html>
"""
