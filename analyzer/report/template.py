"""The page's frame: its styles, its optional script and the HTML around the sections. Inline,
because the report must open offline; the Content-Security-Policy makes sure nothing is fetched.
"""

STYLE = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f7f8fa;
        --critical:#c62828; --warning:#e07b00; --info:#1d6fb8; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans","Liberation Sans",sans-serif; }
main { max-width:1120px; margin:0 auto; padding:24px 28px 48px; }
h1 { font-size:28px; margin:0; letter-spacing:-0.5px; }
h2 { font-size:22px; margin:36px 0 12px; padding-bottom:6px; border-bottom:2px solid var(--line); }
h3 { font-size:17px; margin:24px 0 6px; }
code { font:13px/1.4 "DejaVu Sans Mono",Menlo,Consolas,monospace; background:#eef1f4; padding:1px 4px;
       border-radius:3px; overflow-wrap:anywhere; }
header { background:#fff; border:1px solid var(--line); border-radius:8px; padding:20px 24px; }
.lede { color:var(--muted); margin:2px 0 12px; }
table.facts th { text-align:left; color:var(--muted); font-weight:600; padding:2px 18px 2px 0;
                 vertical-align:top; white-space:nowrap; }
table.facts td { padding:2px 0; }
.tiles { display:flex; gap:12px; margin:16px 0 8px; flex-wrap:wrap; }
.tile { flex:1; min-width:200px; display:block; text-decoration:none; color:var(--ink); background:#fff;
        border:1px solid var(--line); border-left:6px solid; border-radius:6px; padding:8px 14px; }
.tile .n { font-size:30px; font-weight:700; margin-right:8px; }
.tile .what { font-weight:600; text-transform:uppercase; letter-spacing:.5px; }
.tile .kinds { display:block; color:var(--muted); font-size:13px; }
.tile.sev-critical { border-left-color:var(--critical); } .tile.sev-critical .n { color:var(--critical); }
.tile.sev-warning { border-left-color:var(--warning); } .tile.sev-warning .n { color:var(--warning); }
.tile.sev-info { border-left-color:var(--info); } .tile.sev-info .n { color:var(--info); }
.verdict { font-weight:600; margin:6px 0; }
nav { margin-top:8px; } nav a { color:var(--info); }
.count { font-size:15px; color:var(--muted); font-weight:400; }
.badge { display:inline-block; color:#fff; font-size:12px; font-weight:700; text-transform:uppercase;
         letter-spacing:.4px; padding:1px 7px; border-radius:10px; vertical-align:2px; }
.badge.sev-critical { background:var(--critical); } .badge.sev-warning { background:var(--warning); }
.badge.sev-info { background:var(--info); }
article.finding { background:#fff; border:1px solid var(--line); border-left:6px solid; border-radius:6px;
                  padding:10px 16px 8px; margin:12px 0; }
article.sev-critical { border-left-color:var(--critical); } article.sev-warning { border-left-color:var(--warning); }
article.sev-info { border-left-color:var(--info); }
article.finding h3 { margin:2px 0 2px; font-size:16px; }
code.kind { font-size:15px; font-weight:700; background:none; padding:0; }
.where { font-weight:600; } .count-of { float:right; color:var(--muted); font-weight:600; }
.meta { color:var(--muted); font-size:13px; margin:0 0 6px; }
.summary { margin:4px 0 8px; }
.advice { background:#f4f6f8; border-radius:4px; padding:6px 12px; font-size:14px; }
.advice p { margin:3px 0; }
details summary { cursor:pointer; color:var(--muted); font-weight:600; margin-top:6px; }
table.evidence { border-collapse:collapse; font-size:13px; margin:4px 0; width:100%; }
table.evidence th { text-align:left; font-weight:600; color:var(--muted); white-space:nowrap; width:1%;
                    padding:2px 14px 2px 0; vertical-align:top; }
table.evidence td { padding:2px 0; }
.items code { display:inline-block; margin:0 4px 3px 0; }
.more, .hint, .why, .id { color:var(--muted); font-size:13px; }
.id { margin:2px 0; }
figure { background:#fff; border:1px solid var(--line); border-radius:6px; margin:10px 0 16px; padding:10px 12px; }
figcaption { font-size:13px; color:var(--muted); margin-top:4px; }
figcaption b { color:var(--ink); }
svg.chart { max-width:100%; height:auto; display:block; }
svg .tick { font-size:11px; fill:#52606d; } svg .axis { font-size:12px; fill:#3e4c59; }
svg .legend { font-size:12px; fill:#1f2933; } svg .note { font-size:12px; fill:#3e4c59; font-weight:600; }
.explain { color:var(--muted); margin:0 0 6px; }
.empty { color:var(--muted); font-style:italic; }
.notice { background:#fff8e1; border:1px solid #f0d58c; border-radius:6px; padding:4px 18px; margin:18px 0; }
.notice h2 { border:none; font-size:18px; margin:10px 0 0; }
.scroll { overflow-x:auto; }
table.connections { border-collapse:collapse; background:#fff; font-size:13px; width:100%;
                    border:1px solid var(--line); }
table.connections th { background:#eef1f4; text-align:left; padding:6px 8px; white-space:nowrap; }
table.connections td { padding:5px 8px; border-top:1px solid var(--line); vertical-align:top; }
table.connections .bad { color:var(--critical); font-weight:600; }
table.connections .product { color:var(--muted); font-size:12px; }
table.connections .addr, table.connections td:nth-child(4) { white-space:nowrap; }
table.connections td:first-child { min-width:230px; } table.connections td:nth-child(5) { min-width:200px; }
table.sortable.js th { cursor:pointer; }
table.index { border-collapse:collapse; background:#fff; border:1px solid var(--line); width:100%;
               font-size:14px; margin:6px 0 14px; }
table.index th { background:#eef1f4; text-align:left; padding:5px 10px; }
table.index td { padding:4px 10px; border-top:1px solid var(--line); }
table.index a { color:var(--ink); } table.index code { background:none; font-weight:700; }
.num { text-align:right; }
.filters { margin:6px 0; } .filters label { margin-right:14px; }
.hidden { display:none; }
footer { color:var(--muted); font-size:12px; margin-top:36px; border-top:1px solid var(--line); padding-top:8px; }
"""

# Optional niceties: filter findings by severity, sort the connections table by a column. The page is
# whole without them (everything is shown; the filter stays hidden unless this runs).
SCRIPT = """
(function () {
  var filters = document.querySelector('.filters');
  if (filters) {
    filters.hidden = false;
    filters.addEventListener('change', function () {
      var on = {};
      document.querySelectorAll('.sev-filter').forEach(function (box) { on[box.value] = box.checked; });
      document.querySelectorAll('article.finding, table.index tr[data-severity]').forEach(function (a) {
        a.classList.toggle('hidden', !on[a.dataset.severity]);
      });
    });
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.classList.add('js');
    table.querySelectorAll('th').forEach(function (th, column) {
      th.title = 'sort';
      th.addEventListener('click', function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var down = th.dataset.down !== '1';
        th.dataset.down = down ? '1' : '0';
        rows.sort(function (a, b) {
          var x = a.cells[column].textContent, y = b.cells[column].textContent;
          var nx = parseFloat(x.replace(/,/g, '')), ny = parseFloat(y.replace(/,/g, ''));
          var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return down ? c : -c;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{title}</title>
<style>{style}</style>
</head>
<body><main>
{body}
</main>
<script>{script}</script>
</body>
</html>
"""
