# Shared by the bench scripts, which source it.

# median_step_ms METRICS [FORMAT]: the median "ms" of a metrics file's steps
# after the first (which warms up), printed by FORMAT (default %.1f), or ?
# where there are none.
median_step_ms() {
  grep -o '"ms": [0-9.e+-]*' "$1" | tail -n +2 | cut -d' ' -f2 | sort -g |
    awk -v f="${2:-%.1f}" '{ v[NR] = $1 } END { if (NR) printf f "\n", v[int((NR + 1) / 2)]; else print "?" }'
}
