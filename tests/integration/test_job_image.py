"""A job's ``image`` is a Docker image reference or nothing: anything a ``docker run`` could read
as an option, or that would split into two arguments, is a 422 problem naming ``image``, and
nothing is stored (the rule is the core's, :mod:`shockwave.domain.image_reference`)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.integration.api_calls import assert_problem, bearer, job_body
from tests.integration.conftest import Tokens


@pytest.mark.parametrize(
    "image",
    [
        "--volume=/:/host:ro",
        "-v/:/host",
        "--privileged",
        "shockwave:latest --user=0:0",
        "Shockwave:latest",
        "shockwave:-x",
        "a=b",
    ],
)
def test_an_image_that_is_no_reference_is_a_422_naming_image(
    client: TestClient, tokens: Tokens, image: str
) -> None:
    response = client.post(
        "/v1/jobs",
        json=job_body(image=image, command=["--user=0:0", "shockwave:latest", "sh"]),
        headers=bearer(tokens.user_a),
    )
    assert_problem(response, 422, field="image", path="/v1/jobs")
    listed = client.get("/v1/jobs", headers=bearer(tokens.admin)).json()
    assert listed["items"] == [], "a refused submission must not be written"


def test_an_image_reference_is_accepted_and_stored(client: TestClient, tokens: Tokens) -> None:
    image = "registry.example.com:5000/team/trainer:v2@sha256:" + "a" * 64
    response = client.post(
        "/v1/jobs",
        json=job_body(image=image, command=["python", "train.py"]),
        headers=bearer(tokens.user_a),
    )
    assert response.status_code == 201, response.text
    assert response.json()["image"] == image
