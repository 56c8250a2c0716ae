"""Drives the device's OpenAI-compatible API with the official openai
package: chat and completions, streaming and not. Prints one JSON object
with what it got; the Go test checks it."""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["DRAGON_BASE_URL"], api_key=os.environ["DRAGON_API_KEY"], max_retries=0)
model = os.environ["DRAGON_MODEL_ID"]
out = {"version": openai.__version__}

messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who lit the lamp?"}]
chat = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12, seed=7,
                                      extra_body={"mode": "device-only"})
out["chat"] = chat.choices[0].message.content
out["chat_finish"] = chat.choices[0].finish_reason
out["usage"] = [chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens]

parts = []
for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12, seed=7, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
out["chat_stream"] = "".join(parts)

comp = client.completions.create(model=model, prompt="Who lit the lamp?", temperature=0, max_tokens=12)
out["completion"] = comp.choices[0].text
parts = []
for chunk in client.completions.create(model=model, prompt="Who lit the lamp?", temperature=0, max_tokens=12, stream=True):
    parts.append(chunk.choices[0].text)
out["completion_stream"] = "".join(parts)

out["models"] = [m.id for m in client.models.list().data]
try:
    client.chat.completions.create(model="gpt-4o", messages=messages)
    out["unknown_model"] = "accepted"
except openai.NotFoundError as e:
    out["unknown_model"] = e.status_code
try:
    client.chat.completions.create(model=model, messages=messages, temperature=5)
    out["bad_temperature"] = "accepted"
except openai.BadRequestError as e:
    out["bad_temperature"] = e.status_code

json.dump(out, sys.stdout)
