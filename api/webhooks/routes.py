"""`/v1/webhooks`: a tenant's endpoints (register, list, show, change, delete, rotate the
secret, send a test), and each endpoint's delivery log (list, retry one).

A URL is checked when it is registered or changed (api.webhooks.guard: a non-public address
is a 422 naming `url`, unless the operator allows its network) and again at every delivery.
The signing secret is shown when an endpoint is created and when it is rotated, not after.
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from store import webhooks
from store.settings import Settings
from store.webhook_tables import DeliveryStatus, WebhookDelivery, WebhookEndpoint

from api.deps import SessionDep, SettingsDep, TenantDep
from api.errors import ApiError, field_error
from api.schemas import ListPublic
from api.webhooks.guard import parse_networks, url_problem

router = APIRouter(prefix="/webhooks", tags=["webhooks"])

EventTypes = list[Literal[webhooks.EVENT_TYPES]]  # type: ignore[valid-type]


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000, description="Where deliveries are POSTed (http or https, a public address).")
    description: str = Field("", max_length=200)
    event_types: EventTypes | None = Field(
        None, description="The event types it receives (default: all): " + ", ".join(webhooks.EVENT_TYPES))


class EndpointUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, max_length=2000)
    description: str | None = Field(None, max_length=200)
    event_types: EventTypes | None = None
    enabled: bool | None = None


class EndpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: str
    url: str
    description: str
    event_types: list[str] | None
    enabled: bool
    created_at: datetime
    secret: str | None = Field(None, description="Only when created or rotated: keep it to verify signatures.")


class DeliveryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    object: Literal["webhook_delivery"] = "webhook_delivery"
    id: int
    message_id: str = Field(description="The `webhook-id` header: deduplicate on it.")
    event_type: str
    payload: dict[str, Any]
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


def _public(row: WebhookEndpoint, with_secret: bool = False) -> EndpointPublic:
    public = EndpointPublic.model_validate(row)
    return public.model_copy(update={"secret": row.secret if with_secret else None})


def _delivery(row: WebhookDelivery) -> DeliveryPublic:
    public = DeliveryPublic.model_validate(row)
    pending = row.status == DeliveryStatus.pending
    return public.model_copy(update={"next_attempt_at": row.next_attempt_at if pending else None})


def _check_url(url: str, settings: Settings) -> None:
    if (problem := url_problem(url, parse_networks(settings.webhook_allowed_networks))) is not None:
        raise field_error("url", problem)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EndpointPublic)
def create_endpoint(body: EndpointCreate, session: SessionDep, settings: SettingsDep,
                    tenant: TenantDep) -> EndpointPublic:
    """Register an endpoint; the answer holds its signing secret (shown this once)."""
    _check_url(body.url, settings)
    if webhooks.count_endpoints(session, tenant.id) >= settings.webhook_max_endpoints:
        raise ApiError(429, f"quota exceeded: at most {settings.webhook_max_endpoints} webhook "
                       "endpoints per tenant (BRORL_WEBHOOK_MAX_ENDPOINTS)", type_="quota_exceeded")
    row = webhooks.create_endpoint(session, tenant.id, body.url, body.description, body.event_types)
    session.commit()
    return _public(row, with_secret=True)


@router.get("", response_model=ListPublic[EndpointPublic])
def list_endpoints(session: SessionDep, tenant: TenantDep) -> ListPublic[EndpointPublic]:
    return ListPublic[EndpointPublic](data=[_public(r) for r in webhooks.list_endpoints(session, tenant.id)])


@router.get("/{endpoint_id}", response_model=EndpointPublic)
def get_endpoint(endpoint_id: str, session: SessionDep, tenant: TenantDep) -> EndpointPublic:
    return _public(webhooks.get_endpoint(session, tenant.id, endpoint_id))


@router.patch("/{endpoint_id}", response_model=EndpointPublic)
def update_endpoint(endpoint_id: str, body: EndpointUpdate, session: SessionDep, settings: SettingsDep,
                    tenant: TenantDep) -> EndpointPublic:
    """Change its URL, description, event types or whether it is enabled."""
    fields = body.model_dump(exclude_unset=True)
    if fields.get("url") is not None:
        _check_url(fields["url"], settings)
    fields = {k: v for k, v in fields.items() if v is not None or k == "event_types"}
    row = webhooks.update_endpoint(session, tenant.id, endpoint_id, **fields)
    session.commit()
    return _public(row)


@router.delete("/{endpoint_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_endpoint(endpoint_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    """Delete it with its delivery log; nothing more is sent to it."""
    webhooks.delete_endpoint(session, tenant.id, endpoint_id)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{endpoint_id}/rotate", response_model=EndpointPublic)
def rotate_secret(endpoint_id: str, session: SessionDep, tenant: TenantDep) -> EndpointPublic:
    """A new signing secret (in the answer); for 24 hours deliveries carry a signature by the
    old one too, so a receiver can switch without missing one."""
    row = webhooks.rotate_secret(session, tenant.id, endpoint_id)
    session.commit()
    return _public(row, with_secret=True)


@router.post("/{endpoint_id}/test", status_code=status.HTTP_202_ACCEPTED, response_model=DeliveryPublic)
def send_test(endpoint_id: str, session: SessionDep, tenant: TenantDep) -> DeliveryPublic:
    """Queue a `webhook.test` delivery to it; follow it in its delivery log."""
    row = webhooks.enqueue_test(session, tenant.id, endpoint_id)
    session.commit()
    return _delivery(row)


@router.get("/{endpoint_id}/deliveries", response_model=ListPublic[DeliveryPublic])
def list_deliveries(endpoint_id: str, session: SessionDep, tenant: TenantDep,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20,
                    after: Annotated[int | None, Query(ge=0, description="The last id of the previous page.")] = None,
                    status_: Annotated[DeliveryStatus | None, Query(alias="status")] = None,
                    ) -> ListPublic[DeliveryPublic]:
    """The endpoint's delivery log, newest first: each event's attempts, answer and error."""
    rows, more = webhooks.list_deliveries(session, tenant.id, endpoint_id, limit, after, status_)
    return ListPublic[DeliveryPublic](data=[_delivery(r) for r in rows], has_more=more)


@router.post("/{endpoint_id}/deliveries/{delivery_id}/retry", response_model=DeliveryPublic)
def retry_delivery(endpoint_id: str, delivery_id: Annotated[int, Field(ge=0, le=2**62)], session: SessionDep,
                   tenant: TenantDep) -> DeliveryPublic:
    """Send a failed delivery once more, now."""
    row = webhooks.retry_delivery(session, tenant.id, endpoint_id, delivery_id)
    session.commit()
    return _delivery(row)
