# Sourced by the A/B tools (ab_bench.sh, ab_sustained.sh): checks their tree arguments and
# fills `dirs` (absolute paths) and `names` (each tree's folder name, which names its runs).
# Exits 2 with the reason on a name that cannot name a file or on two trees of one name.
dirs=()
names=()
for d in "$@"; do
  d=$(cd "$d" && pwd) || exit 2
  name=$(basename "$d")
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "tree name '$name': use letters, digits, '.', '_' or '-'"; exit 2; }
  for n in "${names[@]}"; do [ "$n" != "$name" ] || { echo "two trees named '$name'"; exit 2; }; done
  dirs+=("$d")
  names+=("$name")
done
