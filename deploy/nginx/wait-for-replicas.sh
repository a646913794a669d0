#!/bin/bash
# The balancer's start (docker-compose.yml): wait until every replica named answers
# GET /v2/health/ready with 200 (at most 120 s), then run nginx. nginx counts a replica that
# refuses a connection as failed for fail_timeout: started before them, its first requests
# would find all three "failed" and answer 502 while they are in fact up.
deadline=$((SECONDS + 120))
for host in "$@"; do
    until exec 3<>"/dev/tcp/$host/8000" 2>/dev/null \
        && printf 'GET /v2/health/ready HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&3 \
        && read -r status <&3 && [[ $status == *" 200 "* ]]; do
        exec 3<&- 3>&- 2>/dev/null
        if ((SECONDS > deadline)); then
            echo "wait-for-replicas: $host not ready after 120 s; starting nginx anyway" >&2
            break
        fi
        sleep 0.5
    done
    exec 3<&- 3>&- 2>/dev/null
done
exec nginx -g 'daemon off;'
