"""Typed dependencies injected into routes: the session, the settings, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session

from api.auth import Principal, authenticate
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def get_principal(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    return authenticate(request, session, settings.open_mode)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
