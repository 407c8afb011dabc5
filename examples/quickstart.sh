#!/usr/bin/env bash
# The main job, start to finish, on the embedded SQLite default (sqlite://dlq.db in a
# scratch directory) with the bundled example dead letters: isolate, inspect, plan, replay.
# Needs a RabbitMQ on 127.0.0.1:5672 (guest/guest) only for the last step.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
echo "quickstart: building dlq and its example queue tool (cargo build; a few minutes the first time)..." >&2
cargo build --quiet --manifest-path "$repo/Cargo.toml" --bin dlq --example queue
echo "quickstart: built; running the main job in a scratch directory" >&2
dlq="$repo/target/debug/dlq"
queue="$repo/target/debug/examples/queue"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export DLQ_OPERATOR="${DLQ_OPERATOR:-quickstart}"

step() { printf '\n$ %s %s\n' "$(basename "$1")" "${*:2}" >&2; "$@"; }

step "$dlq" migrate -o table
step "$dlq" import "$repo/examples/dead-letters.jsonl" -o table
# 1. Isolate: which source still produces bad messages?
step "$dlq" aggregate --by reason,producer,schema_version -o table
step "$dlq" list --reason poison_message --producer billing --limit 3 -o table
# 2. Inspect one record (a non-UTF-8 poison body is shown as a hex dump).
id=$("$dlq" list --producer legacy-gateway -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
step "$dlq" show "$id" -o table
# 3. Inventory is back: plan the homogeneous retries_exhausted group and replay it gently.
#    (Here to a scratch queue standing in for inventory.adjust, via --routing-key.)
target="dlq-quickstart-$$"
step "$dlq" plan --reason retries_exhausted --producer inventory -o json > plan.json
step "$queue" declare "$target"
trap '"$queue" delete "$target" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
step "$dlq" replay --plan plan.json --routing-key "$target" --rate 20/s --yes -o json
step "$queue" drain "$target"
step "$dlq" aggregate --by reason,producer -o table
