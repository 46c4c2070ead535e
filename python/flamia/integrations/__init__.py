"""Integrations of flamia with training frameworks.

Each integration is a submodule imported on its own (`import flamia.integrations.transformers`),
so that `import flamia` never imports a framework it does not need.
"""
