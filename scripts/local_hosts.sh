#!/bin/sh
# Host discovery for elastic Horovod on ONE machine (horovodrun --host-discovery-script).
# Two names for the same host, one slot each: when a worker dies Horovod blacklists its host,
# so with one name ("localhost:2") the only host goes and the job ends; with two, the other
# worker trains on. A blacklisted name comes back after --blacklist-cooldown-range seconds and
# a new worker joins. On a cluster, print the live hosts ("host:slots", one a line) instead.
echo localhost:1
echo 127.0.0.1:1
