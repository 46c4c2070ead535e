#!/usr/bin/env bash
# The commands of calls 2-4 (one warm H100, right after call 1 = job11.sh), as they ran.
# call2: the library-asked refusals on a GPU (main at 45c145e, .ab/head) and flamia_boundary_probe
#        (.ab/pdlkinds); call3: v132's backward boundaries one kind at a time (.ab/pdlkinds,
#        settings all, bases, dkdv, poison; two rounds; its v90 files did not come back);
#        call4: all and v90 again, two rounds (v90's files kept). job9.sh's env_ab.sh settings
#        split FLAMIA_PDL=dq,slabs at its comma (env_ab_attempt_console.txt), so the loops call
#        flamia_bench directly.
set -uo pipefail
: "${OUT:?}"
case "${1:-}" in
call2)
  export FLAMIA_LIBRARY=$PWD/.ab/head/prebuilt/libflamia.so PYTHONPATH=$PWD/python
  (cd python/tests && FLAMIA_REQUIRE_GPU=1 timeout 100 python3 -m pytest -q -p no:cacheprovider test_errors.py \
    test_low_memory.py 2>&1 | tail -3) | tee $OUT/pytest_tail.txt
  timeout 90 .ab/pdlkinds/prebuilt/flamia_boundary_probe > $OUT/boundary_probe.txt 2>&1 ;;
call3|call4)
  B=.ab/pdlkinds/prebuilt/flamia_bench
  settings="all:unset v90:dq,slabs bases:dq,slabs,bases dkdv:dq,slabs,dkdv poison:dq,slabs,poison"
  [ "$1" = call4 ] && settings="all:unset v90:dq,slabs"
  for r in 1 2; do for s in $settings; do
    n=${s%%:*} v=${s#*:}
    if [ "$v" = unset ]; then e=(); else e=(FLAMIA_PDL=$v); fi
    env "${e[@]}" $B --workloads fixed-4k,pack-32k --recipes fp8,fp8_mixed --iters 20 --json $OUT/$n.r$r.json \
      > /dev/null 2>&1 || echo "$n r$r failed"
  done; done ;;
*) echo "usage: $0 call2|call3|call4"; exit 2 ;;
esac
