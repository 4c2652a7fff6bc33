#!/usr/bin/env bash
# Checks the launch scripts (dist_launch.sh, slurm_launch.sh) share; they
# source this file. Each check prints why and exits 2 before any rank or
# task starts.

# check_config NAME CONFIG USAGE: the config exists, as a file or as
# MMDetection's package::relative name (tools/train.py's own resolver).
check_config() {
    local name="$1" config="$2" usage="$3"
    if [[ "$config" == *::* ]]; then
        "${PYTHON:-python3}" -c 'import sys; sys.path.insert(0, sys.argv[1])
from train import config_file
config_file(sys.argv[2], sys.argv[3])' "$(dirname "${BASH_SOURCE[0]}")" \
            "$config" "$name" || exit 2
    elif [ ! -f "$config" ]; then
        echo "$name: config file '$config' does not exist. $usage" >&2
        exit 2
    fi
}
