#!/usr/bin/env bash
# scripts/bench.sh's JSON file and charts (--json, --plot, scripts/bench-plot.sh), checked from
# what they contain rather than from pixels:
#
#   tests/bench/plot_check.sh SOURCE_DIR BUILD_DIR
#
# Runs bench.sh once (-n 1) at 8 B and 64 KiB on both paths without UCX, then asserts that
#   - the JSON parses (python3 -m json.tool, or a line-by-line check of bench.sh's layout
#     where there is no python3) and has positive latency and tagged_bw results at both sizes
#     for tandem and tcp;ofi_rxm (link) and for tandem and shm (local);
#   - latency.png and bandwidth.png are PNG files (their first 8 bytes) of some size;
#   - latency.svg and bandwidth.svg draw exactly the series the JSON's medians name (the
#     <title> of each <g id="gnuplot_plot_N"> group, as a set, against "PROVIDER (link)" /
#     "PROVIDER (node-local)" for every provider and path with latency, resp. tagged_bw,
#     medians), and each series' line goes through as many points as there are sizes (the
#     coordinates of the data part of the group's <path d='M x,y L x,y ...'>, whose first
#     subpath is the sample line in the key).
# gnuplot missing is a failure, not a skip: scripts/install-deps.sh installs gnuplot-nox.
set -u

if [ $# != 2 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
    exit 2
fi
src=$1 build=$2
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
# indent TEXT: TEXT with every line indented, for the failure messages
indent() { printf '%s\n' "$1" | sed 's/^/    /'; }

command -v gnuplot >/dev/null 2>&1 || {
    echo "FAIL: gnuplot not found; the charts need it (apt-get install gnuplot-nox, or scripts/install-deps.sh)"
    exit 1
}
out=$(mktemp -d "${TMPDIR:-/tmp}/bench-plot-check.XXXXXX")
charts=$out/charts json=$out/charts.json

echo "== scripts/bench.sh -b $build -n 1 --sizes 8,64k --paths link,local --no-ucx --plot $charts --json $json"
if ! bash "$src/scripts/bench.sh" -b "$build" -n 1 --sizes 8,64k --paths link,local --no-ucx \
        --plot "$charts" --json "$json"; then
    echo "FAIL: scripts/bench.sh exited non-zero (output above; files kept in $out)"
    exit 1
fi
echo

# --- the JSON -----------------------------------------------------------------------------
[ -s "$json" ] || { echo "FAIL: no JSON file $json (kept $out)"; exit 1; }
if command -v python3 >/dev/null 2>&1 && python3 -c '' 2>/dev/null; then
    if err=$(python3 -m json.tool "$json" 2>&1 >/dev/null); then
        echo "ok: the JSON parses (python3 -m json.tool)"
    else
        fail "the JSON does not parse: $err"
    fi
else
    # bench.sh's layout: "{", members one a line, arrays of one object a line, "}"
    bad=$(awk 'NR == 1 && $0 != "{" { print NR ": " $0; next }
               /^  "[a-z]+": ("[^"]*"|[0-9]+|\[[^]]*\]),$/ { next }
               /^  "[a-z]+": \[$/ || /^  \],?$/ || /^\}$/ || NR == 1 { next }
               /^    \{"[a-z]+":.*\},?$/ { next }
               { print NR ": " $0 }' "$json")
    if [ -z "$bad" ] && [ "$(tail -n 1 "$json")" = "}" ]; then
        echo "ok: the JSON has bench.sh's layout (no python3 here to parse it)"
    else
        fail "the JSON does not have bench.sh's layout; lines: ${bad:-(the last is not \"}\")}"
    fi
fi

# records SECTION: the objects of one of the JSON's arrays, "path|provider|metric|size|value"
records() {
    awk -v want="$1" '
        function field(line, key,   s) {
            if (match(line, "\"" key "\": *\"[^\"]*\"")) {
                s = substr(line, RSTART, RLENGTH); sub(/^"[^"]*": *"/, "", s); return substr(s, 1, length(s) - 1)
            }
            if (match(line, "\"" key "\": *[^,}\" ]+")) {
                s = substr(line, RSTART, RLENGTH); sub(/^"[^"]*": */, "", s); return s
            }
            return ""
        }
        $0 ~ "^ *\"" want "\": *\\[" { on = 1; next }
        on && /^ *\]/ { on = 0 }
        on && /^ *\{/ { print field($0, "path") "|" field($0, "provider") "|" field($0, "metric") "|" \
                              field($0, "size") "|" field($0, "value") }' "$json"
}
results=$(records results)
medians=$(records medians)
sizes=$(sed -n 's/^ *"sizes": *\[\([^]]*\)\].*/\1/p' "$json" | tr -d ' ' | tr ',' ' ')
if [ "$sizes" = "8 65536" ]; then
    echo "ok: sizes $sizes"
else
    fail "\"sizes\" should be [8,65536], found [$sizes]"
fi
nsizes=$(wc -w <<<"$sizes")
missing=""
for pp in "link|tandem" "link|tcp;ofi_rxm" "local|tandem" "local|shm"; do
    for metric in latency tagged_bw; do
        for size in 8 65536; do
            v=$(awk -F'|' -v k="$pp|$metric|$size" '$1 "|" $2 "|" $3 "|" $4 == k { print $5; exit }' <<<"$results")
            if ! awk -v v="$v" 'BEGIN { exit !(v != "" && v + 0 > 0) }'; then
                missing+=$'\n'"    $pp $metric $size: ${v:-none}"
            fi
        done
    done
done
if [ -z "$missing" ]; then
    echo "ok: positive latency and tagged_bw results at 8 and 65536 for tandem, tcp;ofi_rxm (link), tandem, shm (local)"
else
    fail "results missing or not positive (path|provider metric size: value):$missing"$'\n'"  the results were:"$'\n'"$(indent "$results")"
fi

# --- the PNGs -----------------------------------------------------------------------------
for name in latency bandwidth; do
    f=$charts/$name.png
    if [ ! -f "$f" ]; then
        fail "$f missing; $charts holds: $(find "$charts" -mindepth 1 -printf '%f ' 2>&1)"
        continue
    fi
    magic=$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')
    bytes=$(wc -c <"$f")
    if [ "$magic" != 89504e470d0a1a0a ]; then
        fail "$name.png does not start as a PNG does (89504e470d0a1a0a): $magic"
    elif [ "$bytes" -lt 10000 ]; then
        fail "$name.png is only $bytes bytes"
    else
        echo "ok: $name.png is a PNG of $bytes bytes"
    fi
done

# --- the SVGs: which series, how many points ----------------------------------------------
# svg_series FILE: "TITLE|POINTS|SUBPATHS" per <g id="gnuplot_plot_N"> group: its <title>, the
# points of its <path>'s data (every subpath after the first, the key's sample line), and how
# many subpaths the path has (2: sample and data).
svg_series() {
    awk '{ doc = doc $0 " " }
         END {
             while ((i = index(doc, "<g id=\"gnuplot_plot_")) > 0) {
                 doc = substr(doc, i + 1)
                 end = index(doc, "<g id=\"gnuplot_plot_"); if (!end) end = length(doc) + 1
                 grp = substr(doc, 1, end - 1)
                 title = ""
                 if (match(grp, /<title>[^<]*<\/title>/)) title = substr(grp, RSTART + 7, RLENGTH - 15)
                 points = 0; subpaths = 0
                 if ((p = index(grp, "<path")) > 0 && (q = index(substr(grp, p), " d=")) > 0) {
                     d = substr(grp, p + q + 2)         # from the quote that opens the d attribute
                     quote = substr(d, 1, 1)
                     d = substr(d, 2)
                     d = substr(d, 1, index(d, quote) - 1)
                     # "M x,y L x,y M x,y L x,y L ...": part[1] is what precedes the first M
                     subpaths = split(d, part, "M") - 1
                     for (s = 3; s <= subpaths + 1; s++) {
                         t = part[s]
                         while (match(t, /-?[0-9.]+,-?[0-9.]+/)) { points++; t = substr(t, RSTART + RLENGTH) }
                     }
                 }
                 print title "|" points "|" subpaths
             }
         }' "$1"
}
# expected METRIC: the series titles the medians call for
expected() {
    awk -F'|' -v m="$1" '$3 == m && !seen[$2 "|" $1]++ { print $2 " (" ($1 == "local" ? "node-local" : $1) ")" }' \
        <<<"$medians" | sort
}
want_titles=$(printf '%s\n' "tandem (link)" "tcp;ofi_rxm (link)" "tandem (node-local)" "shm (node-local)" | sort)
for chart in latency:latency bandwidth:tagged_bw; do
    name=${chart%%:*} metric=${chart#*:}
    f=$charts/$name.svg
    if [ ! -s "$f" ]; then
        fail "$f missing or empty"
        continue
    fi
    series=$(svg_series "$f")
    got=$(cut -d'|' -f1 <<<"$series" | sed '/^$/d' | sort)
    want=$(expected "$metric")
    if [ -n "$got" ] && [ "$got" = "$want" ]; then
        echo "ok: $name.svg draws the series the medians name: $(tr '\n' ',' <<<"$got" | sed 's/,$//; s/,/, /g')"
    else
        fail "$name.svg draws the series"$'\n'"$(indent "${got:-(none)}")"$'\n'"  the JSON's $metric medians name"$'\n'"$(indent "${want:-(none)}")"
    fi
    if [ "$want" != "$want_titles" ]; then
        fail "the JSON's $metric medians name"$'\n'"$(indent "${want:-(none)}")"$'\n'"  not (without UCX) exactly"$'\n'"$(indent "$want_titles")"
    fi
    while IFS='|' read -r title points subpaths; do
        [ -n "$title$points" ] || continue
        if [ "$points" = "$nsizes" ] && [ "$subpaths" = 2 ]; then
            echo "ok: $name.svg \"$title\": $points points"
        else
            fail "$name.svg \"$title\": its path has $points data points in $subpaths subpaths; want $nsizes (one a size) after the key's sample line"
        fi
    done <<<"$series"
done

echo
if [ "$fails" != 0 ]; then
    echo "plot_check: $fails check(s) FAILED; files kept in $out"
    exit 1
fi
rm -rf "$out"
echo "plot_check: all checks passed"
