"""The JSON schemas of the resize API's bodies and answers, for its OpenAPI description
(docs/rest-api.md describes the same shapes; :mod:`xce_resize_plugin.core.converters`
makes the answers)."""

from __future__ import annotations

from typing import Any

from xce_resize_plugin.core.events import EVENT_TYPES
from xce_resize_plugin.core.models import JobState

_TASK = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "host": {"type": "string"},
    },
    "required": ["id", "host"],
    "additionalProperties": False,
}
_HOST_COUNTS = {
    "type": "object",
    "description": "Tasks per host, hosts in allocation order (LSB_MCPU_HOSTS).",
    "additionalProperties": {"type": "integer", "minimum": 1},
}
_TASKS = {"type": "array", "items": {"$ref": "#/components/schemas/ResizeTask"}}
_PENDING = {
    "type": "object",
    "properties": {
        "min": {"type": "integer", "minimum": 1},
        "max": {"type": "integer", "minimum": 1},
        "failures": {"type": "integer", "minimum": 0},
        "requested_at": {"type": "number"},
    },
    "required": ["min", "max", "failures", "requested_at"],
    "additionalProperties": False,
}
_AUTORESIZE = {
    "autoresize": {
        "type": "boolean",
        "description": "Autoresize is on (bsub -ar): the plugin keeps a grow pending "
        "up to max_tasks. For a job not started yet, its submission's flag.",
    },
    "demand": {
        "description": "The autoresize demand: the pending grow the plugin keeps "
        "(1 to max_tasks minus the current tasks), if any.",
        "oneOf": [{"type": "null"}, _PENDING],
    },
}
_STATUS_PROPERTIES: dict[str, Any] = {
    "job_id": {"type": "string"},
    "phase": {
        "type": "string",
        "enum": [
            "IDLE",
            "GROW_PENDING",
            "GROW_NOTIFYING",
            "GROW_STARTING",
            "SHRINK_NOTIFYING",
            "SHRINK_DRAINING",
            "SHRINK_STOPPING",
            "ENDED",
        ],
    },
    "tasks": {**_TASKS, "description": "The committed allocation; task 0 is the head task."},
    "hosts": _HOST_COUNTS,
    "min_tasks": {"type": "integer"},
    "max_tasks": {"type": "integer"},
    "version": {"type": "integer", "minimum": 0, "description": "The allocation version."},
    "pending": {
        "description": "The pending grow, if any (the autoresize demand included).",
        "oneOf": [{"type": "null"}, _PENDING],
    },
    **_AUTORESIZE,
    "target": {
        "description": "The job's target size, if one is set: the plugin grows or "
        "releases until the job holds `tasks` (PUT .../resize/target).",
        "oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/ResizeTargetState"}],
    },
    "in_flight": {
        "description": "The change in flight, if any: tasks added (grow) or released (shrink).",
        "oneOf": [
            {"type": "null"},
            {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "enum": ["grow", "shrink"]},
                    "tasks": _TASKS,
                },
                "required": ["kind", "tasks"],
                "additionalProperties": False,
            },
        ],
    },
}
_OPTIONS = {
    "cancel_pending": {
        "type": "boolean",
        "default": False,
        "description": "Cancel the pending grow first (bresize -c).",
    },
    "notify_cmd": {
        "type": ["string", "null"],
        "maxLength": 4095,
        "description": "Notification command for this change (bresize -rnc); "
        "less than 4096 bytes in UTF-8.",
    },
    "no_notify": {
        "type": "boolean",
        "default": False,
        "description": "Run no notification command (bresize -rncn).",
    },
}


_GRACE = {
    "grace": {
        "type": ["number", "null"],
        "minimum": 0,
        "description": "Drain time in seconds before the released tasks are stopped "
        "(`--grace`), at most the site's `max_stop_grace`; null: the job's default "
        "(given at submission, else 0).",
    },
}


# --- declarative size and conditional changes (docs/in-job-api.md, "A target size") ---
_IF_VERSION = {
    "if_version": {
        "type": ["integer", "null"],
        "minimum": 0,
        "description": "Refuse the change (409 XCE_RESIZE_VERSION_CHANGED) unless the "
        "job's allocation is still at this version.",
    },
}
_PREFER = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0},
    "description": "Task ids to release first when the job is above its target (still "
    "held ones, in this order); the release policy picks the rest. Never task 0.",
}
_TARGET_SCHEMAS: dict[str, Any] = {
    "ResizeTargetRequest": {
        "type": "object",
        "description": "`xce-resize target JOB N [--prefer IDS]`: converge on N tasks.",
        "properties": {
            "tasks": {
                "type": "integer",
                "minimum": 1,
                "description": "The job's target size, within min_tasks..max_tasks.",
            },
            "release_prefer": _PREFER,
        },
        "required": ["tasks"],
        "additionalProperties": False,
    },
    "ResizeTargetState": {
        "type": "object",
        "properties": {"tasks": {"type": "integer", "minimum": 1}, "release_prefer": _PREFER},
        "required": ["tasks", "release_prefer"],
        "additionalProperties": False,
    },
}


def _release_form(name: str) -> dict[str, Any]:
    schema = _RELEASE_FORMS[name]
    return {"required": [name], "properties": {name: {"type": schema["type"][0]}}}


_RELEASE_FORMS: dict[str, dict[str, Any]] = {
    "spec": {
        "type": ["string", "null"],
        "description": "LSF release specification: `all`, `all ~hostA ~2*hostB`, "
        "`hostA`, `2*hostB`.",
    },
    "hosts": {
        "type": ["object", "null"],
        "additionalProperties": {"type": ["integer", "null"], "minimum": 1},
        "description": "Host -> tasks to release there (null: all of the job's tasks there).",
    },
    "task_ids": {
        "type": ["array", "null"],
        "items": {"type": "integer", "minimum": 0},
        "description": "Task ids to release.",
    },
    "count": {
        "type": ["integer", "null"],
        "minimum": 1,
        "description": "How many tasks to release (chosen by the site's policy).",
    },
}

# A grow's readiness wait (docs/in-job-api.md, "Readiness and exits").
_READINESS: dict[str, Any] = {
    "wait_ready": {
        "type": "boolean",
        "default": False,
        "description": "Commit the grow only once every new task called ready() "
        "(its tasks not ready by the deadline are stopped).",
    },
    "ready_timeout": {
        # null is the default, as the handler takes it (and as for the other options).
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "description": "Seconds from the launch of the new tasks to be ready, at most "
        "the site's [resize] max_ready_timeout (default, or null: that maximum); needs "
        "wait_ready.",
    },
}


SCHEMAS: dict[str, Any] = {
    "ResizeTask": _TASK,
    "ResizeStatus": {
        "type": "object",
        "properties": _STATUS_PROPERTIES,
        "required": sorted(_STATUS_PROPERTIES),
        "additionalProperties": False,
    },
    "ResizeWaitResult": {
        "type": "object",
        "properties": {
            **_STATUS_PROPERTIES,
            "done": {
                "type": "boolean",
                "description": "Nothing pending or in flight, and a newer version.",
            },
            "job_state": {"type": "string", "enum": [s.value for s in JobState]},
            "gave_up": {
                "type": "boolean",
                "description": "A change pending or in flight during the wait ended "
                "without a new version (it failed or was cancelled).",
            },
        },
        "required": [*sorted(_STATUS_PROPERTIES), "done", "job_state", "gave_up"],
        "additionalProperties": False,
    },
    "ResizeHistory": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "segments": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "start": {"type": "number"},
                        "end": {"type": "number"},
                        "slots": {"type": "integer", "minimum": 1},
                    },
                    "required": ["start", "end", "slots"],
                    "additionalProperties": False,
                },
            },
            "slot_seconds": {"type": "number", "minimum": 0},
            **_AUTORESIZE,
            "records": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "time": {"type": "number"},
                        "type": {"type": "string", "enum": ["grow", "shrink"]},
                        "before": _HOST_COUNTS,
                        "delta": _HOST_COUNTS,
                        "after": _HOST_COUNTS,
                        "delta_tasks": {"type": "array", "items": {"type": "integer"}},
                        "version": {"type": "integer", "minimum": 1},
                        # Only on a change nobody asked for (docs/failover.md).
                        "reason": {"type": "string", "enum": ["host_failure", "task_exit"]},
                    },
                    "required": [
                        "time",
                        "type",
                        "before",
                        "delta",
                        "after",
                        "delta_tasks",
                        "version",
                    ],
                    "additionalProperties": False,
                },
            },
        },
        "required": [
            "job_id",
            "segments",
            "slot_seconds",
            "autoresize",
            "demand",
            "records",
        ],
        "additionalProperties": False,
    },
    "TaskReady": {
        "type": "object",
        "description": "What `POST /v1/jobs/{id}/tasks/{task_id}/ready` answers.",
        "properties": {
            "job_id": {"type": "string"},
            "task_id": {"type": "integer", "minimum": 0},
            "ready": {"type": "boolean", "const": True},
            "phase": {"type": "string", "description": "The job's resize phase now."},
            "version": {"type": "integer", "description": "The allocation version now."},
        },
        "required": ["job_id", "task_id", "ready", "phase", "version"],
        "additionalProperties": False,
    },
    "ResizeGrowRequest": {
        "type": "object",
        "description": "`bresize request [min_tasks,]tasks`: ask for min_tasks..tasks more.",
        "properties": {
            "tasks": {"type": "integer", "minimum": 1, "description": "Most tasks to add."},
            "min_tasks": {
                "type": "integer",
                "minimum": 1,
                "description": "Fewest tasks worth adding (default: tasks).",
            },
            **_OPTIONS,
            **_READINESS,
            **_IF_VERSION,
        },
        "required": ["tasks"],
        "additionalProperties": False,
    },
    "JobModify": {
        "type": "object",
        "description": "`xce-resize modify --autoresize | --no-autoresize` (bmod -ar/-arn).",
        "properties": {
            "autoresize": {
                "type": "boolean",
                "description": "Turn autoresize on (a running resizable job with a task "
                "range) or off (its demand is withdrawn).",
            },
        },
        "required": ["autoresize"],
        "additionalProperties": False,
    },
    "ResizeReleaseRequest": {
        "type": "object",
        "description": "`bresize release`: exactly one of spec, hosts, task_ids, count.",
        "properties": {**_RELEASE_FORMS, **_OPTIONS, **_GRACE, **_IF_VERSION},
        "oneOf": [_release_form(name) for name in _RELEASE_FORMS],
        "additionalProperties": False,
    },
    # -- drain before stop and job events (docs/in-job-api.md) --------------------------
    "ResizeDrained": {
        "type": "object",
        "description": "The job's tasks of the release being drained that may stop now.",
        "properties": {
            "task_ids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "minItems": 1,
                "description": "Task ids of the release being drained.",
            },
        },
        "required": ["task_ids"],
        "additionalProperties": False,
    },
    "JobEvents": {
        "type": "array",
        "description": "The job's events after the cursor, oldest first.",
        "items": {"$ref": "#/components/schemas/JobEvent"},
    },
    "JobEvent": {
        "type": "object",
        "description": "One event of the job: `seq` (from 1, increasing, the same after "
        "a controller restart), `type`, `time`, and the fields of its type: "
        "`task_ids` (every type but job_ended), `tasks` (grow_placed), `version` "
        "(grow_committed, size_changed), `deadline` (release_coming), `status` and "
        "`reason` (tasks_exited), `host`, `status` and `reason` (tasks_lost), `tasks_before` and "
        "`tasks_after` (size_changed).",
        "properties": {
            "seq": {"type": "integer", "minimum": 1},
            "type": {"type": "string", "enum": list(EVENT_TYPES)},
            "time": {"type": "number"},
            "task_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "tasks": _TASKS,
            "version": {"type": "integer", "minimum": 0},
            "deadline": {"type": "number"},
            "status": {"type": ["integer", "null"]},
            "reason": {"type": "string"},
            "host": {"type": "string"},
            "tasks_before": {"type": "integer", "minimum": 0},
            "tasks_after": {"type": "integer", "minimum": 0},
        },
        "required": ["seq", "type", "time"],
        "additionalProperties": False,
    },
    **_TARGET_SCHEMAS,
}


def schema_fields(name: str) -> tuple[str, ...]:
    """The top-level fields of schema ``name`` (what a body may hold)."""
    return tuple(SCHEMAS[name]["properties"])


__all__ = ["SCHEMAS", "schema_fields"]
