"""The connector's scheduler role (vLLM's scheduler process): admission, step plans, worker reports.

Provides:
    ConnectorScheduler      connector_scheduler.py: owns the TierManager; StepPlans out, WorkerReports in;
                            its state in core.py, its verbs in admission.py, steps.py and reports.py
    RequestTracker          requests.py: vLLM requests' block hashes and block ids; blocks that become full
"""

from .connector_scheduler import ConnectorScheduler
from .requests import RequestTracker

__all__ = ["ConnectorScheduler", "RequestTracker"]
