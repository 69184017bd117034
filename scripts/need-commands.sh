# Sourced by the scripts that bring their own tools (fabtests.sh, imb.sh, hpcc.sh,
# device-kit.sh): need_commands COMMAND:PACKAGE... installs with apt the packages of the
# commands that are missing, and every +PACKAGE named outright (sudo when not root; apt-get
# update first, as a fresh machine needs). Nothing is done when nothing is missing.
need_commands() {
    local pair sudo=""
    local -a packages=()
    for pair in "$@"; do
        case $pair in
            +*) packages+=("${pair#+}") ;;
            *) command -v "${pair%%:*}" >/dev/null 2>&1 || packages+=("${pair#*:}") ;;
        esac
    done
    ((${#packages[@]})) || return 0
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        $(printf '%s\n' "${packages[@]}" | sort -u)
}
