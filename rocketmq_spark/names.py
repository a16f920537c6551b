"""RocketMQ's rules for topic and group names (the Java client's Validators, TopicValidator).

One home for them: the embedded broker refuses bad names with them, the CLI and the Spark
options check them before anything is sent.
"""

from __future__ import annotations

import re

__all__ = ["AUTO_CREATE_TOPIC", "DLQ_PREFIX", "GROUP_MAX_LENGTH", "GROUP_RULE", "NAME_CHARS", "RETRY_PREFIX",
           "TOPIC_MAX_LENGTH", "TOPIC_RULE", "dead_letter_topic", "group_problem", "retry_topic", "topic_problem"]

#: the characters a topic or group name may use
NAME_CHARS = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
#: what is accepted, for error messages
TOPIC_RULE = f"RocketMQ's rule: {NAME_CHARS.pattern}, at most {TOPIC_MAX_LENGTH} characters"
GROUP_RULE = f"RocketMQ's rule: {NAME_CHARS.pattern}, at most {GROUP_MAX_LENGTH} characters"
#: the topic whose route a broker with autoCreateTopicEnable offers for topics not created yet
AUTO_CREATE_TOPIC = "TBW102"
#: a consumer group's retry topic is this prefix + the group (messages given back, redelivered later)
RETRY_PREFIX = "%RETRY%"
#: a consumer group's dead-letter topic is this prefix + the group (given back too often)
DLQ_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dead_letter_topic(group: str) -> str:
    return DLQ_PREFIX + group


def _problem(kind: str, name: str, max_length: int) -> str | None:
    if not name:
        return f"the {kind} name is empty"
    if len(name) > max_length:
        return f"the {kind} name is {len(name)} characters long; at most {max_length} are accepted"
    if not NAME_CHARS.match(name):
        return f"the {kind} name may contain only letters, digits, '%', '|', '_' and '-'"
    return None


def topic_problem(topic: str) -> str | None:
    """None when ``topic`` is a valid topic name, else what is wrong with it."""
    return _problem("topic", topic, TOPIC_MAX_LENGTH)


def group_problem(group: str) -> str | None:
    """None when ``group`` is a valid consumer or producer group name, else what is wrong."""
    return _problem("group", group, GROUP_MAX_LENGTH)
