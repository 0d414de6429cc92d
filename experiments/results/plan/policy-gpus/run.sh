#!/usr/bin/env bash
# GPUs needed with a policy in the loop vs the best static split (issue 22), on two shipped scenarios.
# Run from the repository root; writes <scenario>/<policy>/{COMMAND.txt,output.txt,plan.json} and TABLE.md.
set -euo pipefail
D=experiments/results/plan/policy-gpus
CACHE=$(mktemp -d)  # static probes are shared by the three policies of one scenario
for scenario in chatbot-8 chat-batch-8; do
  for spec in baseline:dynamo-legacy file:policies/examples/seed_pd_policy.yaml learned:default; do
    name=$(echo "$spec" | sed 's#file:policies/examples/##; s#[:/.]#-#g')
    out="$D/$scenario/$name"
    mkdir -p "$out"
    cmd=(pdctl plan --workload "experiments/scenarios/$scenario.yaml" --policy "$spec" --workers 2
         --cache-dir "$CACHE" --quiet --top 5 --out "$out")
    echo "${cmd[*]}" | sed "s#$CACHE#\$CACHE#" > "$out/COMMAND.txt"
    { /usr/bin/time -f "wall %e s, user %U s" "${cmd[@]}"; } > "$out/output.txt" 2>&1
    rm -f "$out/best_scenario.yaml" "$out/pareto.png"
  done
done
rm -rf "$CACHE"
python - "$D" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
rows = ["| scenario | policy | GPUs needed (policy) | GPUs needed (best static) | best static at that size | GPUs saved "
        "| max rate at budget, policy | max rate at budget, best static | static validated (whole source, seed 1) |",
        "|---|---|---:|---:|---|---:|---|---|---|"]
for plan in sorted(root.glob("*/*/plan.json")):
    d = json.loads(plan.read_text())
    p = d["policy"]
    rows.append(
        f"| {plan.parent.parent.name} | `{p['spec']}` | {p['policy_gpus']} | {p['static_gpus']} | {p['static_config']} "
        f"| {p['gpus_saved']} | x{p['policy_max_rate_scale']:.3g} ({p['policy_max_rate_rps']:.2f} req/s) "
        f"| x{d['best']['max_rate_scale']:.3g} ({d['max_sustainable_rps']:.2f} req/s, {d['best']['label']}) "
        f"| {'yes' if d['validation']['passed'] else 'NO'} |"
    )
(root / "TABLE.md").write_text("\n".join(rows) + "\n")
PY
cat "$D/TABLE.md"
