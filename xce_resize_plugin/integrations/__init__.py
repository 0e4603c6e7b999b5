"""Elastic frameworks on a resizable job, ready-made (docs/frameworks.md).

Each integration is a subpackage with an extra of its own (``dask``: ``pip install
'xce_resize_plugin[dask]'``). They use the in-job API (:mod:`xce_resize_plugin.injob`)
and nothing else of the package, and nothing in the package imports them
(``.importlinter``), so the core never pays for a framework it does not use.
"""
