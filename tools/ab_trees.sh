# Sourced by the A/B tools (ab_bench.sh, ab_sustained.sh), with what they share: the usage
# (two trees at least), OUT (default ./out, made and absolute), WORKLOADS (default
# fixed-16k,pack-32k,llama8b-pack,llama1b-pack), ROUNDS (default 3, a positive integer); then
# it checks their tree arguments and fills `dirs` (absolute paths), `names` (what names each
# one's runs), `envs` (the VAR=value settings its runs get, space-separated) and `described`
# (name and settings, for a summary's description). An argument is [NAME=]DIR[:VAR=value,...]:
# the name defaults to the folder's name, and the settings let one tree be timed under
# several run-time switches, e.g. `auto=.ab/main recompute=.ab/main:FLAMIA_BWD_DQ=recompute`.
# Exits 2 with the reason on a name that cannot name a file, two arguments of one name, or a
# setting that is not VAR=value (a value without spaces or commas).
[ $# -ge 2 ] || { echo "usage: $0 DIR_REF DIR [DIR ...]"; exit 2; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORKLOADS=${WORKLOADS:-fixed-16k,pack-32k,llama8b-pack,llama1b-pack}
ROUNDS=${ROUNDS:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: '$ROUNDS' is not a positive integer"; exit 2; }
dirs=()
names=()
envs=()
described=()
for spec in "$@"; do
  name=
  head=${spec%%=*}
  if [[ $spec == *=* && $head =~ ^[A-Za-z0-9_.-]+$ ]]; then name=$head; spec=${spec#*=}; fi
  settings=
  if [[ $spec == *:* ]]; then settings=${spec#*:}; spec=${spec%%:*}; fi
  d=$(cd "$spec" && pwd) || exit 2
  [ -n "$name" ] || name=$(basename "$d")
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "tree name '$name': use letters, digits, '.', '_' or '-'"; exit 2; }
  for n in "${names[@]}"; do [ "$n" != "$name" ] || { echo "two trees named '$name'"; exit 2; }; done
  e=
  if [ -n "$settings" ]; then
    IFS=, read -ra pairs <<<"$settings"
    for s in "${pairs[@]}"; do
      [[ $s =~ ^[A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*$ ]] || { echo "$name: setting '$s' is not VAR=value"; exit 2; }
      e="$e${e:+ }$s"
    done
  fi
  dirs+=("$d")
  names+=("$name")
  envs+=("$e")
  described+=("$name${e:+ ($e)}")
done
