# Shared by install-agent.sh and install-master.sh (sourced, not run): option parsing
# for what both take, and every step that changes the machine, each of which only
# prints what it would do under --dry-run.
# shellcheck shell=bash
# The variables set here are read by the installers that source this file:
# shellcheck disable=SC2034

: "${PROGRAM:=install}"

DEPLOY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

ROOT=/
R=""  # ROOT without its trailing slash: prefix of every path written
DRY_RUN=0
UNINSTALL=0
PURGE=0
OVERWRITE_CONFIG=0
PACKAGE=""  # default: the Assay checkout this deploy/ folder sits in
PYTHON=""
VENV=/opt/assay/venv
VENV_ARGS=""
PIP_ARGS=""
NO_DEPS=0
SERVICE_USER=assay

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
    printf '%s: error: %s\n' "$PROGRAM" "$*" >&2
    exit 1
}

# Options every installer takes; sets SHIFT to how many arguments were used (0: not one
# of these).
common_option() {
    SHIFT=1
    case "$1" in
        --root) need_value "$@" && ROOT=$2 && SHIFT=2 ;;
        --root=*) ROOT=${1#*=} ;;
        --dry-run) DRY_RUN=1 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        --overwrite-config) OVERWRITE_CONFIG=1 ;;
        --package) need_value "$@" && PACKAGE=$2 && SHIFT=2 ;;
        --package=*) PACKAGE=${1#*=} ;;
        --python) need_value "$@" && PYTHON=$2 && SHIFT=2 ;;
        --python=*) PYTHON=${1#*=} ;;
        --venv) need_value "$@" && VENV=$2 && SHIFT=2 ;;
        --venv=*) VENV=${1#*=} ;;
        --venv-args) need_value "$@" && VENV_ARGS=$2 && SHIFT=2 ;;
        --venv-args=*) VENV_ARGS=${1#*=} ;;
        --pip-args) need_value "$@" && PIP_ARGS=$2 && SHIFT=2 ;;
        --pip-args=*) PIP_ARGS=${1#*=} ;;
        --no-deps) NO_DEPS=1 ;;
        --user) need_value "$@" && SERVICE_USER=$2 && SHIFT=2 ;;
        --user=*) SERVICE_USER=${1#*=} ;;
        *) SHIFT=0 ;;
    esac
}

need_value() {
    [ "$#" -ge 2 ] || die "$1 needs a value"
}

COMMON_USAGE="Installation:
  --package SPEC       what pip installs: a wheel file, a source checkout, or assay==X.Y.Z
                       from your own package index (default: the Assay checkout this
                       deploy/ folder sits in; required when it sits in none. PyPI's
                       'assay' is another project)
  --pip-args ARGS      more pip install arguments, e.g. '--extra-index-url URL' for a torch
                       build, or '--no-index --find-links DIR' on a machine without internet
  --no-deps            install Assay alone: its dependencies (torch, grpcio, ...) must already
                       be importable, e.g. with --venv-args=--system-site-packages on a Python
                       that has them
  --python PATH        Python 3.11+ for the virtual environment (default: the newest found)
  --venv DIR           the virtual environment (default: /opt/assay/venv)
  --venv-args ARGS     more 'python -m venv' arguments, e.g. --system-site-packages
  --user NAME          the account the service runs as (default: assay, created when missing)
  --overwrite-config   replace an existing config file (default: keep it, upgrade the rest)
  --uninstall          stop and remove the service and the virtual environment (the config
                       is kept)
  --purge              with --uninstall: remove the config as well
  --dry-run            print what would be done and change nothing
  --root DIR           install under DIR instead of / (tests, images): systemctl and
                       account steps are skipped there
  -h, --help           show this help"

# After parsing: normalise paths and check what can be checked before changing anything.
finish_common_options() {
    case "$ROOT" in
        /*) ;;
        *) die "--root must be an absolute path, got '$ROOT'" ;;
    esac
    R=${ROOT%/}
    case "$VENV" in
        /*) ;;
        *) die "--venv must be an absolute path, got '$VENV'" ;;
    esac
    check_unit_path "$VENV" --venv
    [[ "$SERVICE_USER" =~ ^[a-z_][a-z0-9_-]*$ ]] || die "--user: '$SERVICE_USER' is not an account name"
    [ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || die "--purge goes with --uninstall"
    [ -n "$PACKAGE" ] || [ "$UNINSTALL" = 1 ] || PACKAGE=$(enclosing_checkout) ||
        die "--package is required: $DEPLOY_DIR is not inside an Assay checkout. Pass a wheel \
(pip wheel --no-deps -w dist /path/to/assay), a checkout, or assay==X.Y.Z from your own \
package index; PyPI's 'assay' is another project"
    if bare_assay_requirement "$PACKAGE" && ! names_an_index "$PIP_ARGS"; then
        die "--package $PACKAGE would install PyPI's 'assay', another project: name your own \
package index or folder of wheels with --pip-args ('--index-url URL' or '--find-links DIR'), \
or pass a wheel or a checkout"
    fi
    if [ -z "$R" ] && [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
        die "run as root (sudo $0 ...), or try --dry-run first"
    fi
}

# A requirement naming the project 'assay' (assay, assay==X.Y.Z, assay[extra]>=X), not a path.
bare_assay_requirement() {
    local lower
    lower=$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')
    [[ "$lower" =~ ^[[:space:]]*assay[[:space:]]*(\[[^]]*\])?[[:space:]]*([=\<\>\!~].*)?$ ]]
}

# Whether pip arguments name where to find packages instead of PyPI.
names_an_index() {
    local arg args
    read -ra args <<<"$1"
    for arg in ${args[@]+"${args[@]}"}; do
        case "$arg" in
            -i | -i?* | --index-url | --index-url=* | -f | -f?* | --find-links | --find-links=*) return 0 ;;
        esac
    done
    return 1
}

# A path written into a unit file: systemd splits on spaces and expands %.
check_unit_path() {
    case "$1" in
        *[[:space:]%\|]*) die "$2 cannot contain spaces, '%' or '|': '$1'" ;;
    esac
}

on_real_root() { [ -z "$R" ]; }

# The source checkout deploy/ sits in, when its pyproject.toml is Assay's.
enclosing_checkout() {
    local checkout
    checkout=$(cd "$DEPLOY_DIR/.." && pwd)
    grep -qx 'name = "assay"' "$checkout/pyproject.toml" 2>/dev/null || return 1
    [ -d "$checkout/src/assay" ] || return 1
    printf '%s\n' "$checkout"
}

# Run a command, or print it under --dry-run.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '    would run: %s\n' "$*"
    else
        printf '    $ %s\n' "$*"
        "$@"
    fi
}

# Write stdin to a file with a mode (and group, on the real root); under --dry-run print
# the content, secret values hidden.
put_file() {
    local path=$1 mode=$2 group=${3:-}
    local content
    content=$(cat)
    if [ "$DRY_RUN" = 1 ]; then
        note "would write $path (mode $mode):"
        printf '%s\n' "$content" | sed -E \
            -e 's/^(join_token|db_url):.*/\1: <hidden>/' \
            -e 's/^/      | /'
        return
    fi
    mkdir -p "$(dirname "$path")"
    local tmp="$path.new.$$"
    (umask 077 && printf '%s\n' "$content" >"$tmp")
    chmod "$mode" "$tmp"
    if [ -n "$group" ] && on_real_root; then
        chgrp "$group" "$tmp"
    fi
    mv -f "$tmp" "$path"
    note "wrote $path"
}

remove() {
    local path
    for path in "$@"; do
        if [ -e "$path" ] || [ -L "$path" ]; then
            run rm -rf -- "$path"
        fi
    done
}

# YAML single-quoted scalar.
yaml_quote() {
    local s=${1//\'/\'\'}
    printf "'%s'" "$s"
}

# systemctl, or why it is skipped.
systemctl_run() {
    if ! on_real_root; then
        note "skipped: systemctl $* (installing under --root $ROOT)"
    elif ! command -v systemctl >/dev/null 2>&1; then
        note "skipped: systemctl $* (systemctl not found: is this machine running systemd?)"
    else
        run systemctl "$@"
    fi
}

service_active() {
    on_real_root && command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$1"
}

find_python() {
    if [ -n "$PYTHON" ]; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "--python $PYTHON: not found"
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            die "--python $PYTHON is older than 3.11, which Assay needs"
        return
    fi
    local candidate
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            PYTHON=$(command -v "$candidate")
            return
        fi
    done
    die "Assay needs Python 3.11 or newer, and none was found: install it (Ubuntu 22.04:" \
        "apt-get install python3.11 python3.11-venv), or name one with --python PATH"
}

# Debian and Ubuntu split venv's pip bootstrap into pythonX.Y-venv.
ensure_venv_module() {
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null && return
    local package
    package="python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
    if on_real_root && command -v apt-get >/dev/null 2>&1; then
        say "Installing $package ($PYTHON cannot create virtual environments without it)"
        run apt-get update
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y "$package"
    else
        die "$PYTHON cannot create virtual environments: install $package"
    fi
}

# Create the virtual environment (or keep it) and install or upgrade Assay in it.
install_venv() {
    local venv="$R$VENV"
    find_python
    if [ -x "$venv/bin/python" ]; then
        say "Upgrading Assay in $venv"
    else
        say "Creating the virtual environment $venv ($PYTHON)"
        ensure_venv_module
        # shellcheck disable=SC2086 # VENV_ARGS is a list of arguments
        run "$PYTHON" -m venv $VENV_ARGS "$venv"
    fi
    local deps=()
    [ "$NO_DEPS" = 1 ] && deps=(--no-deps)
    # shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
    run "$venv/bin/python" -m pip install --upgrade --disable-pip-version-check \
        ${deps[@]+"${deps[@]}"} $PIP_ARGS "$PACKAGE"
    if [ "$DRY_RUN" = 0 ]; then
        note "installed assay $("$venv/bin/python" -c 'import assay; print(assay.__version__)')"
    fi
}

# The account the service runs as; the installer never deletes it.
ensure_user() {
    [ "$SERVICE_USER" = root ] && return
    if ! on_real_root; then
        note "skipped: creating the account '$SERVICE_USER' (installing under --root $ROOT)"
        return
    fi
    if id "$SERVICE_USER" >/dev/null 2>&1; then
        note "the service runs as '$SERVICE_USER' (exists)"
        return
    fi
    say "Creating the system account '$SERVICE_USER'"
    run useradd --system --user-group --home-dir /var/lib/assay --no-create-home \
        --shell /usr/sbin/nologin "$SERVICE_USER"
}

# Install a unit from deploy/systemd, its placeholders filled in.
put_unit() {
    local name=$1 config=$2
    local template="$DEPLOY_DIR/systemd/$name"
    [ -f "$template" ] || die "missing $template: run the installer from Assay's deploy/ folder"
    sed -e "s|@VENV@|$VENV|g" -e "s|@CONFIG@|$config|g" -e "s|@USER@|$SERVICE_USER|g" \
        "$template" | put_file "$R/etc/systemd/system/$name" 0644
}

# Enable and start a new service; restart one that runs (an upgrade).
start_service() {
    local name=$1
    systemctl_run daemon-reload
    if service_active "$name"; then
        systemctl_run restart "$name"
    else
        systemctl_run enable --now "$name"
    fi
}

# Stop and remove a service and, when no other Assay service uses it, the virtual
# environment.
uninstall_service() {
    local name=$1 other=$2
    say "Removing $name"
    if on_real_root && command -v systemctl >/dev/null 2>&1 &&
        systemctl cat "$name" >/dev/null 2>&1; then
        run systemctl disable --now "$name"
    else
        systemctl_run disable --now "$name"
    fi
    remove "$R/etc/systemd/system/$name"
    systemctl_run daemon-reload
    if [ -e "$R/etc/systemd/system/$other" ]; then
        note "kept $R$VENV: $other uses it too"
    elif [ -e "$R$VENV" ] && { [ ! -f "$R$VENV/pyvenv.cfg" ] || [ ! -e "$R$VENV/bin/python" ]; }; then
        # Never rm -rf a directory that is not a virtual environment (a mistyped --venv).
        note "kept $R$VENV: it is not a Python virtual environment"
    else
        remove "$R$VENV"
        remove_if_empty "$(dirname "$R$VENV")"
    fi
}

remove_if_empty() {
    if [ -d "$1" ] && [ -z "$(ls -A "$1")" ]; then
        run rmdir "$1"
    fi
}

# Whether to write the config: not when one exists, unless --overwrite-config.
should_write_config() {
    local path=$1
    if [ -e "$path" ] && [ "$OVERWRITE_CONFIG" = 0 ]; then
        say "Keeping $path (pass --overwrite-config to write a new one)"
        return 1
    fi
    return 0
}

# Ask on the terminal for a value that was not given; "" without a terminal.
ask() {
    local prompt=$1 secret=${2:-0} answer=""
    if [ -t 0 ]; then
        if [ "$secret" = 1 ]; then
            read -r -s -p "$prompt: " answer
            printf '\n' >&2
        else
            read -r -p "$prompt: " answer
        fi
    fi
    printf '%s' "$answer"
}

# Validate a config with the installed program (it knows every key), ignoring the
# installer's environment.
check_config() {
    local program=$1 config=$2
    if [ "$DRY_RUN" = 1 ]; then
        note "would check $config with $program --check-config"
        return
    fi
    local out var unset=()
    for var in $(compgen -e); do
        case "$var" in ASSAY_*) unset+=(-u "$var") ;; esac
    done
    if ! out=$(env ${unset[@]+"${unset[@]}"} "$R$VENV/bin/$program" --config "$R$config" \
        --check-config 2>&1); then
        die "$R$config is not valid for the Assay just installed: ${out##*error: }." \
            "Fix it and run $PROGRAM again (the service was not restarted)"
    fi
    note "checked $config"
}
