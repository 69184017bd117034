#!/usr/bin/env bash
# Charts of the medians in a JSON file of scripts/bench.sh's default mode (bench.sh --plot runs
# this; it also works on any saved file):
#
#   scripts/bench-plot.sh JSON OUTDIR
#
# OUTDIR/latency.png    tagged ping-pong latency (us, half round trip) against message size,
#                       both axes logarithmic
# OUTDIR/bandwidth.png  tagged-send bandwidth (MB/s) against message size, size axis logarithmic
# OUTDIR/latency.svg, OUTDIR/bandwidth.svg  the same charts from the same gnuplot commands; each
#                       series is a <g id="gnuplot_plot_N"> group whose <title> names it (the
#                       svg terminal writes those names only in enhanced mode, so the terminals
#                       are enhanced and the texts themselves noenhanced: "ofi_rxm" stays so)
#
# One series per provider and path, titled "PROVIDER (link)" or "PROVIDER (node-local)"; a
# provider keeps its colour (its place among its path's providers) and the node-local series
# are dashed. Sizes of 0 bytes are left out (a logarithmic axis has no place for them). Needs
# bash, awk and gnuplot (Debian: gnuplot-nox). Reads the "medians" array with awk, one object
# per line as bench.sh writes it.
set -euo pipefail

if [ $# != 2 ]; then
    echo "usage: $0 JSON OUTDIR" >&2
    exit 2
fi
json=$1 outdir=$2
command -v gnuplot >/dev/null 2>&1 || {
    echo "bench-plot.sh: gnuplot not found (apt-get install gnuplot-nox, or scripts/install-deps.sh)" >&2
    exit 1
}
[ -r "$json" ] || { echo "bench-plot.sh: cannot read $json" >&2; exit 1; }
mkdir -p "$outdir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# $work/series: "N COLOUR DASH POINT TITLE" a series, in order of first appearance;
# $work/METRIC_N.dat: "SIZE VALUE" lines of series N; $work/sizes: every size; $work/head:
# "runs host date".
awk -v work="$work" '
    # the value of "key" in line: a string (unescaped) or a number; "" when absent
    function field(line, key,   s, v, i, c, o) {
        if (match(line, "\"" key "\": *\"([^\"\\\\]|\\\\.)*\"")) {
            s = substr(line, RSTART, RLENGTH)
            sub(/^"[^"]*": *"/, "", s)
            s = substr(s, 1, length(s) - 1)
            o = ""
            for (i = 1; i <= length(s); i++) {
                c = substr(s, i, 1)
                if (c == "\\" && i < length(s)) { i++; c = substr(s, i, 1) }
                o = o c
            }
            return o
        }
        if (match(line, "\"" key "\": *[^,}\" ]+")) {
            v = substr(line, RSTART, RLENGTH)
            sub(/^"[^"]*": */, "", v)
            return v
        }
        return ""
    }
    !inmed && /^ *"runs":/ { runs = field($0, "runs") }
    !inmed && /^ *"host":/ { host = field($0, "host") }
    !inmed && /^ *"date":/ { date = field($0, "date") }
    /^ *"medians": *\[/ { inmed = 1; next }
    inmed && /^ *\]/ { inmed = 0; next }
    inmed && /^ *\{/ {
        path = field($0, "path"); prov = field($0, "provider"); metric = field($0, "metric")
        size = field($0, "size"); value = field($0, "value")
        if (metric != "latency" && metric != "tagged_bw") next
        if (size + 0 <= 0 || value == "") next
        k = prov SUBSEP path
        if (!(k in series)) {
            series[k] = ++n
            # link and local: a provider keeps its colour on both paths, node-local dashed;
            # other path names (docker/bench.sh set-ups, one provider each): a colour each
            std = path == "link" || path == "local"
            colour = std ? ++nprov[path] : n
            dash = path == "local" ? 2 : 1
            point = path == "link" ? 7 : path == "local" ? 4 : 5 + n % 4
            printf "%d %d %d %d %s (%s)\n", n, colour, dash, point, prov, path == "local" ? "node-local" : path \
                >(work "/series")
        }
        print size, value >(work "/" metric "_" series[k] ".dat")
        if (!(size in seen)) { seen[size] = 1; print size >(work "/sizes") }
    }
    END { print runs, host, date >(work "/head") }' "$json"
[ -s "$work/series" ] || { echo "bench-plot.sh: no latency or tagged_bw medians in $json" >&2; exit 1; }

read -r runs host date <"$work/head"
sort -n -o "$work/sizes" "$work/sizes"
# the size axis: a tic at every size measured, named as bench.sh names them (8, 64K, 1M)
xtics=$(awk '{ b = $1
               if (b >= 1048576 && b % 1048576 == 0) l = b / 1048576 "M"
               else if (b >= 1024 && b % 1024 == 0) l = b / 1024 "K"
               else l = b
               printf "%s\"%s\" %s", (NR > 1 ? ", " : ""), l, b }' "$work/sizes")
xmin=$(awk 'NR == 1 { print $1 / 1.5 }' "$work/sizes")
xmax=$(awk 'END { print $1 * 1.5 }' "$work/sizes")
colours=("#1f77b4" "#d62728" "#2ca02c" "#9467bd" "#ff7f0e" "#8c564b" "#e377c2" "#17becf")

# chart METRIC NAME TITLE YLABEL LOGY: writes OUTDIR/NAME.png and OUTDIR/NAME.svg
chart() {
    local metric=$1 name=$2 title=$3 ylabel=$4 logy=$5 gp=$work/$2.gp plots="" n colour dash point t
    while read -r n colour dash point t; do
        [ -s "$work/${metric}_$n.dat" ] || continue
        sort -n -o "$work/${metric}_$n.dat" "$work/${metric}_$n.dat"
        t=${t//\'/\'\'}  # gnuplot's single-quoted strings double a quote
        plots+="${plots:+, }'$work/${metric}_$n.dat' using 1:2 with linespoints"
        plots+=" linewidth 2 linecolor rgb '${colours[(colour - 1) % ${#colours[@]}]}' dashtype $dash"
        plots+=" pointtype $point pointsize 1.2 title '$t' noenhanced"
    done <"$work/series"
    [ -n "$plots" ] || { echo "bench-plot.sh: no $metric medians in $json" >&2; return 1; }
    {
        printf '%s\n' "set title \"$title\\nmedians of $runs run$([ "$runs" = 1 ] || echo s); $host, $date\" noenhanced"
        echo "set xlabel 'message size (bytes)'"
        echo "set ylabel '$ylabel'"
        echo "set logscale x 2"
        echo "set xrange [$xmin:$xmax]"
        echo "set xtics ($xtics)"
        if [ "$logy" = 1 ]; then
            echo "set logscale y 10"
            echo "set mytics 10"
            echo "set grid xtics ytics mytics"
        else
            echo "set yrange [0:*]"
            echo "set grid xtics ytics"
        fi
        echo "set format y '%g'"
        echo "set key top left box"
        echo "plot $plots"
        echo "unset output"
    } >"$gp"
    gnuplot -e "set terminal pngcairo size 1000,650 enhanced font 'sans,10' background rgb 'white'" \
            -e "set output '$outdir/$name.png'" "$gp"
    gnuplot -e "set terminal svg size 1000,650 enhanced font 'sans,12' background rgb 'white'" \
            -e "set output '$outdir/$name.svg'" "$gp"
}

chart latency latency "tagged ping-pong latency (half round trip, lower is better)" "latency (us)" 1
chart tagged_bw bandwidth "tagged-send bandwidth (higher is better)" "bandwidth (MB/s)" 0
