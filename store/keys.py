"""Tenants and API keys. Only a key's sha256 and a short display prefix are stored.

A key is `brorl_` + 43 url-safe random characters (256 bits), so a plain unsalted sha256 is
enough: nothing about the key can be guessed, and looking it up by its hash means the
comparison never touches the secret itself.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.tables import ApiKey, Tenant, utcnow

KEY_PREFIX = "brorl_"
DISPLAY_PREFIX_CHARS = 12


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def get_tenant(s: Session, name: str) -> Tenant | None:
    return s.scalar(select(Tenant).where(Tenant.name == name))


def create_tenant(s: Session, name: str) -> Tenant:
    """The tenant called `name`, created if missing."""
    tenant = get_tenant(s, name)
    if tenant is None:
        tenant = Tenant(name=name)
        s.add(tenant)
        s.flush()
    return tenant


def create_key(s: Session, tenant_name: str) -> str:
    """Make a new key for the tenant (created if missing); returns the plaintext, once."""
    tenant = create_tenant(s, tenant_name)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    s.add(ApiKey(tenant_id=tenant.id, prefix=key[:DISPLAY_PREFIX_CHARS], key_hash=hash_key(key)))
    s.flush()
    return key


def authenticate(s: Session, key: str) -> Tenant | None:
    """The tenant owning an unrevoked `key`, or None."""
    if not key or not key.startswith(KEY_PREFIX):
        return None
    query = (
        select(Tenant)
        .join(ApiKey, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    )
    return s.scalar(query)


def list_all_keys(s: Session, tenant_name: str | None = None) -> list[tuple[ApiKey, str]]:
    """(key, tenant name) for every key, or one tenant's: for operators (`brorl keys list`)."""
    query = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
    if tenant_name is not None:
        query = query.where(Tenant.name == tenant_name)
    return [(k, name) for k, name in s.execute(query.order_by(ApiKey.id))]


def find_keys(s: Session, ref: str) -> list[ApiKey]:
    """Keys matching `ref`: a key id (as listed), or the start of its display prefix."""
    if ref.isdigit():
        key = s.get(ApiKey, int(ref))
        return [key] if key is not None else []
    if len(ref) < len(KEY_PREFIX) + 2:  # "brorl_" alone would match every key
        return []
    return list(s.scalars(select(ApiKey).where(ApiKey.prefix.startswith(ref[:DISPLAY_PREFIX_CHARS],
                                                                        autoescape=True))))


def revoke_key(s: Session, key_id: int) -> bool:
    """Revoke a key by its id (`find_keys`); returns whether an active key was revoked."""
    stmt = (
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return s.execute(stmt).rowcount == 1
