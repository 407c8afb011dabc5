#!/usr/bin/env bash
# A throw-away 3-node RabbitMQ cluster on loopback, for tests/cluster.rs.
#
# It never touches the system broker (rabbit@localhost on 5672): its own node names
# (dlqa, dlqb, dlqc), ports, data directories, cookie and epmd, and none of the system
# configuration (/etc/rabbitmq is replaced by files under DIR).
#
#   cluster.sh up DIR BASE      start 3 nodes (AMQP on BASE, BASE+1, BASE+2) and join them
#   cluster.sh down DIR         stop every node and the private epmd
#   cluster.sh kill DIR N       SIGKILL node N (0, 1 or 2)
#   cluster.sh start DIR N      start node N again (it rejoins the cluster)
#   cluster.sh stop DIR N       stop node N gracefully
#   cluster.sh ctl DIR N ARGS   rabbitmqctl against node N
#   cluster.sh queues DIR N ARGS  rabbitmq-queues against node N
set -euo pipefail

RMQ=/usr/lib/rabbitmq/bin
NAMES=(dlqa dlqb dlqc)
cmd=${1:?usage: cluster.sh up|down|kill|start|stop|ctl|queues DIR ...}
DIR=${2:?state directory}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

if [ "$cmd" = up ]; then
    BASE=${3:?base port}
    echo "$BASE" > "$DIR/base"
fi
BASE=$(cat "$DIR/base")
EPMD=$((BASE + 200))

node_env() {
    local i=$1 n=${NAMES[$1]}
    unset ERL_FLAGS ERL_AFLAGS ERL_ZFLAGS RABBITMQ_NODENAME RABBITMQ_USE_LONGNAME
    export HOME="$DIR/home"
    export ERL_EPMD_PORT=$EPMD
    export ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_NODENAME="$n@localhost"
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$((BASE + i))
    export RABBITMQ_DIST_PORT=$((BASE + 100 + i))
    export RABBITMQ_MNESIA_BASE="$DIR/$n/mnesia"
    export RABBITMQ_LOG_BASE="$DIR/$n/log"
    export RABBITMQ_PID_FILE="$DIR/$n/pid"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins"
    export RABBITMQ_CONFIG_FILE="$DIR/$n/rabbitmq.conf"
    export RABBITMQ_CONFIG_FILES="$DIR/$n/conf.d"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$DIR/$n/advanced.config"
    export RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf"
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_DIST_PORT_MIN=$((BASE + 150 + 3 * i))
    export RABBITMQ_CTL_DIST_PORT_MAX=$((BASE + 152 + 3 * i))
}

ctl() {
    local i=$1
    shift
    (node_env "$i" && "$RMQ/rabbitmqctl" -n "${NAMES[$i]}@localhost" "$@")
}

start_node() {
    local i=$1 n=${NAMES[$1]}
    mkdir -p "$DIR/$n/mnesia" "$DIR/$n/log" "$DIR/$n/conf.d"
    cat > "$DIR/$n/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((BASE + i))
loopback_users.guest = true
vm_memory_high_watermark.absolute = 1GB
EOF
    echo "[]." > "$DIR/$n/advanced.config"
    (node_env "$i" && "$RMQ/rabbitmq-server" -detached >/dev/null 2>&1)
    ctl "$i" await_startup --timeout 60 >/dev/null 2>&1
}

pid_of() {
    local n=${NAMES[$1]} pid
    pid=$(cat "$DIR/$n/pid" 2>/dev/null) || return 1
    # The pid file's process must be this node's beam, never the system broker.
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RABBITMQ_NODENAME=$n@localhost" || return 1
    echo "$pid"
}

case "$cmd" in
up)
    mkdir -p "$DIR/home"
    if [ ! -f "$DIR/home/.erlang.cookie" ]; then
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/home/.erlang.cookie"
        chmod 400 "$DIR/home/.erlang.cookie"
    fi
    : > "$DIR/rabbitmq-env.conf"
    echo "[]." > "$DIR/enabled_plugins"
    epmd -port "$EPMD" -address 127.0.0.1 -daemon
    for i in 0 1 2; do start_node "$i" & done
    wait
    # Each step is retried: on a busy machine a node can take a while to answer.
    retry() {
        local n
        for n in 1 2 3 4 5; do
            "$@" >/dev/null 2>&1 && return 0
            sleep 2
        done
        "$@"
    }
    for i in 1 2; do
        retry ctl "$i" stop_app
        retry ctl "$i" reset
        retry ctl "$i" join_cluster dlqa@localhost
        retry ctl "$i" start_app
    done
    retry ctl 0 await_startup
    ;;
down)
    for i in 0 1 2; do
        if pid=$(pid_of "$i"); then
            ctl "$i" stop >/dev/null 2>&1 || kill -9 "$pid" 2>/dev/null || true
        fi
    done
    for i in 0 1 2; do
        if pid=$(pid_of "$i"); then kill -9 "$pid" 2>/dev/null || true; fi
    done
    ERL_EPMD_PORT=$EPMD epmd -kill >/dev/null 2>&1 || true
    ;;
kill)
    pid=$(pid_of "${3:?node}") && kill -9 "$pid"
    ;;
start)
    start_node "${3:?node}"
    ;;
stop)
    ctl "${3:?node}" stop >/dev/null
    ;;
ctl)
    i=${3:?node}
    shift 3
    ctl "$i" "$@"
    ;;
queues)
    i=${3:?node}
    shift 3
    (node_env "$i" && "$RMQ/rabbitmq-queues" -n "${NAMES[$i]}@localhost" "$@")
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
