#!/bin/sh
# A Dask computation on a resizable job (docs/frameworks.md, "Dask").
#
# Every task of the job runs this script. Task 0 runs the computation
# (dask_adaptive.py next to this file), which starts the Dask scheduler with
# XCECluster() and lets Dask's adaptive policy grow and shrink the job; every other
# task is a worker (xce-dask-worker), named by its task id. Submit it with:
#
#   xce-resize submit -n 1,8 --initial 1 --resizable --grace 60 --env PATH="$PATH" \
#       -- /bin/sh "$PWD/docs/examples/dask_job.sh" --items 200
#
# (--grace 60: a release made from outside the job leaves up to 60 s to retire its
# workers, and ends as soon as they are; --env PATH: the tasks find the python3 and
# xce-dask-worker of the environment where xce_resize_plugin[dask] is installed.)
# The job ends when task 0 does.
echo "start $XCE_TASK_ID $(date +%s.%N)"
if [ "$XCE_TASK_ID" = 0 ]; then
    exec python3 "$(dirname "$0")/dask_adaptive.py" "$@"
fi
exec xce-dask-worker
