"""Each trajectory's policy key works for that trajectory only, and only while it runs."""

from __future__ import annotations

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.gateway import PolicyGateway
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Context, Policy, PolicyError
from tests.runtime.helpers import entry, sample

HI = [{"role": "user", "content": "hi"}]


def test_a_key_records_into_its_own_trajectory_only(gateway: PolicyGateway) -> None:
    mine, other = gateway.open("keys-a"), gateway.open("keys-b")
    mine.chat(HI, max_tokens=3)
    mine.chat(HI, max_tokens=3)
    assert gateway.take("keys-b").response_ids == []  # nothing reached the other trajectory
    assert len(gateway.take("keys-a").response_mask) > 0
    assert other.api_key != mine.api_key


def test_a_key_stops_working_when_its_trajectory_ends(gateway: PolicyGateway) -> None:
    ended, running = gateway.open("keys-ended"), gateway.open("keys-running")
    ended.chat(HI, max_tokens=2)
    gateway.take("keys-ended")
    with pytest.raises(PolicyError) as info:
        ended.chat(HI, max_tokens=2)
    text = str(info.value)
    assert "answered 401" in text and "invalid_api_key" in text
    assert "this API key belonged to trajectory keys-ended, which has ended" in text
    assert "not one kept from an earlier call" in text
    running.chat(HI, max_tokens=2)  # the other trajectory's key still works
    assert gateway.take("keys-running").response_ids


def test_a_retried_trajectory_gets_a_new_key_and_the_old_one_stops(gateway: PolicyGateway) -> None:
    first = gateway.open("keys-retried")
    second = gateway.open("keys-retried")  # the caller retries the rollout: its record starts over
    with pytest.raises(PolicyError, match="trajectory keys-retried, which was started over"):
        first.chat(HI, max_tokens=2)
    second.chat(HI, max_tokens=2)
    assert gateway.take("keys-retried").response_ids


def test_unknown_and_missing_keys_are_401s_that_say_so(gateway: PolicyGateway) -> None:
    with pytest.raises(PolicyError, match="answered 401.*this one is unknown"):
        Policy(gateway.base_url, "pt-guessed").chat(HI)
    with pytest.raises(PolicyError, match="answered 401.*No API key provided"):
        Policy(gateway.base_url, "").chat(HI)


async def test_a_rollout_using_an_earlier_trajectorys_policy_fails_saying_why(
    gateway: PolicyGateway,
) -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("reach.py", "keeps_first_policy"))
        first = gateway.open("kept-1")
        assert (await fn.invoke(Context(trajectory_id="kept-1"), first, sample())).status == "success"
        gateway.take("kept-1")
        second = gateway.open("kept-2")
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(Context(trajectory_id="kept-2"), second, sample())
        assert info.value.cause == Cause.ERROR_500.value
        assert "this API key belonged to trajectory kept-1, which has ended" in info.value.message
        assert gateway.take("kept-2").response_ids == []
