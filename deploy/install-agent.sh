#!/usr/bin/env bash
# Install the Assay agent on a Debian or Ubuntu machine as a systemd service.
#
#   sudo deploy/install-agent.sh --master 10.0.0.5:8090 --join-token "$TOKEN"
#
# Run it again to upgrade (the config is kept); --uninstall removes it. Every option is
# listed by --help.
set -euo pipefail

PROGRAM=install-agent.sh
# shellcheck source-path=SCRIPTDIR source=install-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/install-lib.sh"

CONFIG=/etc/assay/agent.yaml
UNIT=assay-agent.service
STATE=/var/lib/assay/agent

MASTER=""
JOIN_TOKEN=""
SLOT_TYPE=""
SLOTS=""
AGENT_ID=""
WORK_DIR=""

usage() {
    cat <<EOF
Usage: sudo $PROGRAM [options]

Installs Assay into a virtual environment, writes $CONFIG, and installs, enables and
starts the $UNIT systemd unit. Run again to upgrade in place: an existing config
is kept unless --overwrite-config.

Agent settings (written to $CONFIG; asked for on a terminal when missing):
  --master HOST:PORT   the master's gRPC address (required)
  --join-token TOKEN   the secret the agent joins with (the master's join_token)
  --slot-type TYPE     cuda (GPUs) or cpu (default: cuda when an NVIDIA GPU is present)
  --slots N            slots to offer (default: every GPU, or one per CPU)
  --agent-id NAME      the agent's name in the cluster (default: the host name)
  --work-dir DIR       where trials are unpacked and run (default: $STATE)

$COMMON_USAGE

Every key of the config, with its default: $VENV/bin/assay-agent --help-config
EOF
}

while [ "$#" -gt 0 ]; do
    common_option "$@"
    if [ "$SHIFT" -gt 0 ]; then
        shift "$SHIFT"
        continue
    fi
    case "$1" in
        --master) need_value "$@" && MASTER=$2 && shift ;;
        --master=*) MASTER=${1#*=} ;;
        --join-token) need_value "$@" && JOIN_TOKEN=$2 && shift ;;
        --join-token=*) JOIN_TOKEN=${1#*=} ;;
        --slot-type) need_value "$@" && SLOT_TYPE=$2 && shift ;;
        --slot-type=*) SLOT_TYPE=${1#*=} ;;
        --slots) need_value "$@" && SLOTS=$2 && shift ;;
        --slots=*) SLOTS=${1#*=} ;;
        --agent-id) need_value "$@" && AGENT_ID=$2 && shift ;;
        --agent-id=*) AGENT_ID=${1#*=} ;;
        --work-dir) need_value "$@" && WORK_DIR=$2 && shift ;;
        --work-dir=*) WORK_DIR=${1#*=} ;;
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
    uninstall_service "$UNIT" assay-master.service
    if [ "$PURGE" = 1 ]; then
        remove "$R$CONFIG" "$R$STATE"
        remove_if_empty "$R/etc/assay"
        remove_if_empty "$R/var/lib/assay"
    else
        note "kept $R$CONFIG (--purge removes it)"
    fi
    [ "$SERVICE_USER" = root ] || note "kept the account '$SERVICE_USER' (userdel $SERVICE_USER removes it)"
    say "Done"
    exit 0
fi

# The settings, checked before anything changes.
WRITE_CONFIG=0
if should_write_config "$R$CONFIG"; then
    WRITE_CONFIG=1
    [ -n "$MASTER" ] || MASTER=$(ask "Master address (HOST:PORT of assay-master's grpc_port)")
    [ -n "$MASTER" ] || die "--master HOST:PORT is required"
    [[ "$MASTER" =~ ^[^[:space:]]+:[0-9]+$ ]] || die "--master must be HOST:PORT, got '$MASTER'"
    if [ -z "$JOIN_TOKEN" ] && [ -t 0 ]; then
        JOIN_TOKEN=$(ask "Join token (the master's join_token; empty for none)" 1)
    fi
    if [ -z "$SLOT_TYPE" ]; then
        if [ -e /dev/nvidiactl ] || command -v nvidia-smi >/dev/null 2>&1; then
            SLOT_TYPE=cuda
        else
            SLOT_TYPE=cpu
            note "no NVIDIA GPU found: offering CPU slots (--slot-type cuda to insist)"
        fi
    fi
    case "$SLOT_TYPE" in cpu | cuda) ;; *) die "--slot-type must be cpu or cuda, got '$SLOT_TYPE'" ;; esac
    [ -z "$SLOTS" ] || [[ "$SLOTS" =~ ^[1-9][0-9]*$ ]] || die "--slots must be a positive integer, got '$SLOTS'"
    WORK_DIR=${WORK_DIR:-$STATE}
    case "$WORK_DIR" in /*) ;; *) die "--work-dir must be an absolute path, got '$WORK_DIR'" ;; esac
else
    for given in MASTER JOIN_TOKEN SLOT_TYPE SLOTS AGENT_ID WORK_DIR; do
        [ -z "${!given}" ] || note "ignored --$(tr '_A-Z' '-a-z' <<<"$given"): the config is kept"
        printf -v "$given" '%s' ""
    done
fi

[ "$DRY_RUN" = 0 ] || say "Dry run: nothing below is changed"
say "Installing the Assay agent"
ensure_user
install_venv

if [ "$WRITE_CONFIG" = 1 ]; then
    say "Writing $R$CONFIG"
    {
        echo "# Assay agent settings, written by $PROGRAM. Every key, with its default:"
        echo "#   $VENV/bin/assay-agent --help-config"
        echo "# After an edit: systemctl restart assay-agent"
        echo "master: $(yaml_quote "$MASTER")"
        [ -z "$JOIN_TOKEN" ] || echo "join_token: $(yaml_quote "$JOIN_TOKEN")"
        echo "slot_type: $SLOT_TYPE"
        [ -z "$SLOTS" ] || echo "slots: $SLOTS"
        [ -z "$AGENT_ID" ] || echo "agent_id: $(yaml_quote "$AGENT_ID")"
        echo "work_dir: $(yaml_quote "$WORK_DIR")"
    } | put_file "$R$CONFIG" 0640 "$([ "$SERVICE_USER" = root ] || echo "$SERVICE_USER")"
    if [ "$WORK_DIR" != "$STATE" ]; then
        run mkdir -p "$R$WORK_DIR"
        if on_real_root && [ "$SERVICE_USER" != root ]; then
            run chown "$SERVICE_USER:" "$WORK_DIR"
        fi
    fi
fi
check_config assay-agent "$CONFIG"

if on_real_root && [ "$SERVICE_USER" != root ]; then
    # GPUs whose device files belong to a group (rather than being open to all).
    for group in video render; do
        if getent group "$group" >/dev/null && ! id -nG "$SERVICE_USER" | grep -qw "$group"; then
            run usermod -aG "$group" "$SERVICE_USER"
        fi
    done
fi

say "Installing the $UNIT unit"
put_unit "$UNIT" "$CONFIG"
start_service "$UNIT"

say "Done. To check the agent:"
note "systemctl status assay-agent"
note "journalctl -u assay-agent -f"
note "assay -m ${MASTER:-MASTER:PORT} agent list    # from any machine with the CLI"
