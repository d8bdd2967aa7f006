"""Notifications to teams: e-mail over SMTP and Slack-style JSON webhooks.

:mod:`gpu_pool.notify.channels` sends without Airflow (the CLI and tests use it);
:mod:`gpu_pool.notify.notifiers` wraps the same senders as Airflow ``BaseNotifier`` classes
whose settings come from Airflow connections.
"""

from gpu_pool.notify.channels import (
    Delivery,
    DeliveryError,
    EmailChannel,
    Notice,
    TeamChannels,
    WebhookChannel,
)

__all__ = ["Delivery", "DeliveryError", "EmailChannel", "Notice", "TeamChannels", "WebhookChannel"]
