# shellcheck shell=bash
# print_bench_table FILE [INDENT]: the table the demo prints from a tandem_bench client's
# output (sourced by scripts/demo.sh and docker/bench.sh, not run).
print_bench_table() {
    awk -v ind="${2:-   }" '!/^#/ && NF >= 4 && $1 ~ /^[0-9]+$/ {
            size = $1 + 0
            if (size >= 1048576 && size % 1048576 == 0) h = size / 1048576 " MiB"
            else if (size >= 1024 && size % 1024 == 0) h = size / 1024 " KiB"
            else h = size " B"
            printf "%s%-7s  one-way latency %8s us   tagged sends %9s MB/s   RMA write %9s MB/s\n", ind, h, $2, $3, $4
         }' "$1"
}
