# SPDX-License-Identifier: Apache-2.0
"""The project's own pre-commit hooks (run by `.pre-commit-config.yaml` and by `.ci/run`)."""
