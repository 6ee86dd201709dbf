# Sourced by the scripts right after `set -euo pipefail`:
#   source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse OPTS -- "$@"
# -h/--help prints the calling script's header comment (its usage) and
# exits 0 before the script does anything; an argument that starts with
# '-' and is not one of OPTS (space-separated, e.g. "--fast") is refused
# with that usage and exit 2. Other arguments are the script's to read.
# The calling script's header comment, without its '# '.
usage_text() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }

usage_or_refuse() {
    local known=$1 a
    shift 2
    for a in "$@"; do
        case "$a" in
            -h|--help)
                usage_text
                exit 0 ;;
            -*)
                if [[ " $known " != *" ${a%%=*} "* ]]; then
                    echo "$(basename "$0"): unknown option '$a'" >&2
                    usage_text | grep -i -A3 '^usage' >&2 || true
                    exit 2
                fi ;;
        esac
    done
}

# For a script whose options after its first argument go on to another
# tool: -h/--help as the first argument, as above, and a first argument
# that is any other option is refused.
usage_if_asked() {
    case "${1:-}" in
        -*) usage_or_refuse "" -- "$1" ;;
    esac
}
