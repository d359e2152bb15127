#!/usr/bin/env bash
# Random model graphs through build, the simulator and the verdict (issue 38; docs/reliability.md
# "Random graphs"): N seeds from START_SEED (default 0) on $JOBS threads (default 2), results in
# seed order, counts per outcome class, refusal reasons with rates, wall time; each distinct bug is
# minimised and saved (default target/graph_fuzz/; `--save tests/data/fuzz` to keep it as a
# regression model). Exit 1 when a bug no open finding (tests/data/fuzz/FINDINGS.md) explains.
#   scripts/graph_fuzz.sh N [START_SEED] [--save DIR] [--no-shrink] [--budget CALLS] [--timeout SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: scripts/graph_fuzz.sh N [START_SEED] [graph_fuzz options]}
shift
START=0
if [ $# -gt 0 ] && [[ $1 != --* ]]; then START=$1; shift; fi
nice -n 10 cargo build --release -q -p ipu-tests --bin graph_fuzz
exec target/release/graph_fuzz "$N" "$START" --jobs "${JOBS:-2}" "$@"
