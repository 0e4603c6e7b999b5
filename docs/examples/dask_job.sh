#!/bin/sh
# A Dask computation on a resizable job (docs/frameworks.md, "Dask").
#
# Every task of the job runs this script. Task 0 runs the computation
# (dask_adaptive.py next to this file), which starts the Dask scheduler with
# XCECluster() and lets Dask's adaptive policy grow and shrink the job; every other
# task is a worker (xce-dask-worker), named by its task id. Submit it with:
#
#   xce-resize submit -n 1,8 --initial 1 --resizable --env PATH="$PATH" \
#       --rnc xce-dask-retire -- /bin/sh "$PWD/docs/examples/dask_job.sh" --items 200
#
# (--env PATH: the tasks find the python3 and xce-dask-worker of the environment
# where xce_resize_plugin[dask] is installed; --rnc xce-dask-retire: a release made
# from outside the job retires its workers before they are stopped.) The job ends
# when task 0 does.
echo "start $XCE_TASK_ID $(date +%s.%N)"
if [ "$XCE_TASK_ID" = 0 ]; then
    exec python3 "$(dirname "$0")/dask_adaptive.py" "$@"
fi
exec xce-dask-worker
