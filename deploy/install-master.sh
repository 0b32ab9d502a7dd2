#!/usr/bin/env bash
# Install the Assay master on a Debian or Ubuntu machine as a systemd service that keeps
# its experiments in PostgreSQL.
#
#   sudo deploy/install-master.sh --db-url 'postgresql+psycopg://assay:PASSWORD@db.example/assay'
#
# Run it again to upgrade (the config is kept); --uninstall removes it. Every option is
# listed by --help.
set -euo pipefail

PROGRAM=install-master.sh
# shellcheck source-path=SCRIPTDIR source=install-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/install-lib.sh"

CONFIG=/etc/assay/master.yaml
UNIT=assay-master.service
STATE=/var/lib/assay/master

DB_URL=""
GRPC_PORT=""
HTTP_PORT=""
HOST=""
STATE_DIR=""
ADVERTISED_ADDRESS=""
JOIN_TOKEN=""

usage() {
    cat <<EOF
Usage: sudo $PROGRAM [options]

Installs Assay into a virtual environment, writes $CONFIG, and installs, enables and
starts the $UNIT systemd unit. Run again to upgrade in place: an existing config
is kept unless --overwrite-config.

Master settings (written to $CONFIG; asked for on a terminal when missing):
  --db-url URL                 the experiment store (required):
                               postgresql+psycopg://USER:PASSWORD@HOST[:PORT]/DATABASE
  --grpc-port PORT             agents, trials and the CLI connect here (default: 8090)
  --http-port PORT             the web UI and HTTP API (default: 8080)
  --host ADDRESS               the address both ports listen on (default: 0.0.0.0)
  --advertised-address H:P     where trials on the agents reach the master (default: this
                               machine's first address and the gRPC port)
  --state-dir DIR              the master's files, e.g. checkpoints of experiments without
                               a checkpoint_storage.host_path (default: $STATE)
  --join-token TOKEN           the secret agents join with (their join_token)

$COMMON_USAGE

Every key of the config, with its default: $VENV/bin/assay-master --help-config
EOF
}

while [ "$#" -gt 0 ]; do
    common_option "$@"
    if [ "$SHIFT" -gt 0 ]; then
        shift "$SHIFT"
        continue
    fi
    case "$1" in
        --db-url) need_value "$@" && DB_URL=$2 && shift ;;
        --db-url=*) DB_URL=${1#*=} ;;
        --grpc-port) need_value "$@" && GRPC_PORT=$2 && shift ;;
        --grpc-port=*) GRPC_PORT=${1#*=} ;;
        --http-port) need_value "$@" && HTTP_PORT=$2 && shift ;;
        --http-port=*) HTTP_PORT=${1#*=} ;;
        --host) need_value "$@" && HOST=$2 && shift ;;
        --host=*) HOST=${1#*=} ;;
        --state-dir) need_value "$@" && STATE_DIR=$2 && shift ;;
        --state-dir=*) STATE_DIR=${1#*=} ;;
        --advertised-address) need_value "$@" && ADVERTISED_ADDRESS=$2 && shift ;;
        --advertised-address=*) ADVERTISED_ADDRESS=${1#*=} ;;
        --join-token) need_value "$@" && JOIN_TOKEN=$2 && shift ;;
        --join-token=*) JOIN_TOKEN=${1#*=} ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
finish_common_options

if [ "$UNINSTALL" = 1 ]; then
    uninstall_service "$UNIT" assay-agent.service
    if [ "$PURGE" = 1 ]; then
        remove "$R$CONFIG"
        remove_if_empty "$R/etc/assay"
    else
        note "kept $R$CONFIG (--purge removes it)"
    fi
    # Checkpoints may live there: the installer never deletes them.
    [ ! -d "$R$STATE" ] || note "kept $R$STATE (the master's files; remove it yourself)"
    note "kept the database: the experiments are still in it"
    [ "$SERVICE_USER" = root ] || note "kept the account '$SERVICE_USER' (userdel $SERVICE_USER removes it)"
    say "Done"
    exit 0
fi

port_ok() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -le 65535 ]; }

# The settings, checked before anything changes.
WRITE_CONFIG=0
if should_write_config "$R$CONFIG"; then
    WRITE_CONFIG=1
    if [ -z "$DB_URL" ]; then
        DB_URL=$(ask "PostgreSQL URL (postgresql+psycopg://USER:PASSWORD@HOST/DATABASE)" 1)
    fi
    [ -n "$DB_URL" ] || die "--db-url is required (postgresql+psycopg://USER:PASSWORD@HOST/DATABASE)"
    case "$DB_URL" in
        postgresql+psycopg://*) ;;
        postgresql://* | postgres://*) die "--db-url must start with postgresql+psycopg:// (the driver Assay uses)" ;;
        sqlite:*) note "a SQLite store serves one machine; a team's master uses PostgreSQL" ;;
        *) die "--db-url must be a postgresql+psycopg:// URL" ;;
    esac
    [ -z "$GRPC_PORT" ] || port_ok "$GRPC_PORT" || die "--grpc-port must be 0-65535, got '$GRPC_PORT'"
    [ -z "$HTTP_PORT" ] || port_ok "$HTTP_PORT" || die "--http-port must be 0-65535, got '$HTTP_PORT'"
    STATE_DIR=${STATE_DIR:-$STATE}
    case "$STATE_DIR" in /*) ;; *) die "--state-dir must be an absolute path, got '$STATE_DIR'" ;; esac
    if [ -z "$ADVERTISED_ADDRESS" ]; then
        case "${HOST:-0.0.0.0}" in
            0.0.0.0 | :: | "[::]") address=$( (hostname -I 2>/dev/null || true) | awk '{print $1}') ;;
            *) address=$HOST ;;  # listening on one address only
        esac
        ADVERTISED_ADDRESS="${address:-$(hostname -f)}:${GRPC_PORT:-8090}"
        note "trials on the agents reach the master at $ADVERTISED_ADDRESS (--advertised-address to change)"
    fi
else
    for given in DB_URL GRPC_PORT HTTP_PORT HOST STATE_DIR ADVERTISED_ADDRESS JOIN_TOKEN; do
        [ -z "${!given}" ] || note "ignored --$(tr '_A-Z' '-a-z' <<<"$given"): the config is kept"
        printf -v "$given" '%s' ""
    done
fi

[ "$DRY_RUN" = 0 ] || say "Dry run: nothing below is changed"
say "Installing the Assay master"
ensure_user
install_venv

if [ "$WRITE_CONFIG" = 1 ]; then
    say "Writing $R$CONFIG"
    {
        echo "# Assay master settings, written by $PROGRAM. Every key, with its default:"
        echo "#   $VENV/bin/assay-master --help-config"
        echo "# After an edit: systemctl restart assay-master"
        echo "db_url: $(yaml_quote "$DB_URL")"
        [ -z "$GRPC_PORT" ] || echo "grpc_port: $GRPC_PORT"
        [ -z "$HTTP_PORT" ] || echo "http_port: $HTTP_PORT"
        [ -z "$HOST" ] || echo "host: $(yaml_quote "$HOST")"
        echo "advertised_address: $(yaml_quote "$ADVERTISED_ADDRESS")"
        echo "state_dir: $(yaml_quote "$STATE_DIR")"
        [ -z "$JOIN_TOKEN" ] || echo "join_token: $(yaml_quote "$JOIN_TOKEN")"
    } | put_file "$R$CONFIG" 0640 "$([ "$SERVICE_USER" = root ] || echo "$SERVICE_USER")"
    if [ "$STATE_DIR" != "$STATE" ]; then
        run mkdir -p "$R$STATE_DIR"
        if on_real_root && [ "$SERVICE_USER" != root ]; then
            run chown "$SERVICE_USER:" "$STATE_DIR"
        fi
    fi
fi
check_config assay-master "$CONFIG"

say "Installing the $UNIT unit"
put_unit "$UNIT" "$CONFIG"
start_service "$UNIT"

say "Done. To check the master:"
note "systemctl status assay-master"
note "journalctl -u assay-master -f"
note "assay -m ${ADVERTISED_ADDRESS:-HOST:8090} agent list"
note "agents: sudo deploy/install-agent.sh --master ${ADVERTISED_ADDRESS:-HOST:8090}"
