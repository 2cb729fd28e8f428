"""The official openai and anthropic Python SDKs against a running ds4-server.

Run by tests/server_bin.rs, which starts the server (tiny model, scripted test
mode, loopback) and passes the URL and the expected token counts computed
with the real tokenizer:  python3 sdk_clients.py URL EXPECT_JSON
Every check raises on failure; the script prints one line per check.
"""

import json
import sys

import anthropic
import openai

URL = sys.argv[1]
EXPECT = json.loads(sys.argv[2])

TOOL_SCRIPT = (
    "Need to list.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n"
    "<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
ARGS = {"command": "ls && pwd", "timeout": 10}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"},
                                                          "timeout": {"type": "integer"}}}}}]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok  {name}")


oa = openai.OpenAI(base_url=URL + "/v1", api_key="ds4", max_retries=0, timeout=60)
an = anthropic.Anthropic(base_url=URL, api_key="ds4", max_retries=0, timeout=60)

# Models.
models = oa.models.list()
check("models.list", [m.id for m in models.data] == ["deepseek-v4-flash"], models)

# Chat, thinking off, usage = tokenizer count of the rendered prompt.
r = oa.chat.completions.create(model="deepseek-chat", messages=[{"role": "user", "content": "Say hi."}],
                               extra_body={"ds4_test_script": "Hello there."})
check("chat content", r.choices[0].message.content == "Hello there.", r)
check("chat finish", r.choices[0].finish_reason == "stop", r)
check("chat usage prompt", r.usage.prompt_tokens == EXPECT["chat_prompt"], r.usage)
check("chat usage completion", r.usage.completion_tokens == EXPECT["hello_tokens"], r.usage)

# Chat streaming, thinking on: reasoning_content deltas then content.
stream = oa.chat.completions.create(model="deepseek-v4-flash", stream=True,
                                    stream_options={"include_usage": True},
                                    messages=[{"role": "user", "content": "Think."}],
                                    extra_body={"ds4_test_script": "Hmm, é😀.</think>Answer 😀."})
reasoning, content, usage, finish = "", "", None, None
for ch in stream:
    if ch.usage:
        usage = ch.usage
    for c in ch.choices:
        d = c.delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        finish = c.finish_reason or finish
check("stream reasoning", reasoning == "Hmm, é😀.", reasoning)
check("stream content", content == "Answer 😀.", content)
check("stream finish+usage", finish == "stop" and usage.completion_tokens > 0, (finish, usage))

# Tool call, parsed by the SDK, then the result sent back and replayed.
msgs = [{"role": "user", "content": "List files."}]
r = oa.chat.completions.create(model="deepseek-v4-flash", messages=msgs, tools=TOOLS, max_tokens=200,
                               extra_body={"ds4_test_script": TOOL_SCRIPT})
m = r.choices[0].message
tc = m.tool_calls[0]
check("tool finish", r.choices[0].finish_reason == "tool_calls", r)
check("tool id", tc.id.startswith("call_") and len(tc.id) == 37, tc.id)
check("tool type/name", tc.type == "function" and tc.function.name == "bash", tc)
check("tool arguments", json.loads(tc.function.arguments) == ARGS, tc.function.arguments)
check("tool content", m.content == "Sure.", m.content)
live = r.usage.total_tokens
msgs += [m.model_dump(exclude_none=True),
         {"role": "tool", "tool_call_id": tc.id, "content": "a.c\n/srv"}]
msgs[1]["reasoning_content"] = "Need to list."
r2 = oa.chat.completions.create(model="deepseek-v4-flash", messages=msgs, tools=TOOLS, max_tokens=20,
                                extra_body={"ds4_test_script": "Done.</think>Two entries."})
d = r2.usage.prompt_tokens_details
check("replay cached = live session", d.cached_tokens == live, (d, live))
check("replay re-evaluates only the suffix", r2.usage.prompt_tokens - d.cached_tokens == EXPECT["tool_suffix"],
      (r2.usage, EXPECT["tool_suffix"]))
check("replay answer", r2.choices[0].message.content == "Two entries.", r2)

# Streaming tool call through the SDK's delta objects.
stream = oa.chat.completions.create(model="deepseek-v4-flash", messages=msgs[:1], tools=TOOLS, max_tokens=200,
                                    stream=True, extra_body={"ds4_test_script": TOOL_SCRIPT})
calls, finish = {}, None
for ch in stream:
    for c in ch.choices:
        finish = c.finish_reason or finish
        for t in c.delta.tool_calls or []:
            e = calls.setdefault(t.index, {"id": None, "name": "", "args": ""})
            e["id"] = t.id or e["id"]
            if t.function:
                e["name"] += t.function.name or ""
                e["args"] += t.function.arguments or ""
check("stream tool call", finish == "tool_calls" and calls[0]["name"] == "bash"
      and json.loads(calls[0]["args"]) == ARGS and calls[0]["id"].startswith("call_"), calls)

# Errors come back as the SDK's exception types.
try:
    oa.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], temperature="hot")
    check("bad request raises", False)
except openai.BadRequestError as e:
    check("bad request raises", "invalid JSON request" in str(e), e)

# Completions.
r = oa.completions.create(model="deepseek-v4-flash", prompt="Once", max_tokens=8,
                          extra_body={"ds4_test_script": "upon a time", "think": False})
check("completions", r.choices[0].text == "upon a time" and r.id.startswith("cmpl-"), r)

# Responses: non-streaming and streaming.
r = oa.responses.create(model="deepseek-v4-flash", input="List.", instructions="Be brief.",
                        tools=[{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
                        reasoning={"effort": "high", "summary": "auto"}, max_output_tokens=200,
                        extra_body={"ds4_test_script": TOOL_SCRIPT})
types = [o.type for o in r.output]
check("responses items", types == ["reasoning", "message", "function_call"], types)
check("responses text", r.output_text == "Sure.", r.output_text)
fc = r.output[2]
check("responses call", fc.name == "bash" and json.loads(fc.arguments) == ARGS and fc.call_id.startswith("call_"), fc)
events = list(oa.responses.create(model="deepseek-v4-flash", input="Hi.", stream=True,
                                  reasoning={"effort": "none"},
                                  extra_body={"ds4_test_script": "Hi ☃ there."}))
check("responses stream lifecycle", events[0].type == "response.created"
      and events[-1].type == "response.completed", [e.type for e in events])
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check("responses stream text", text == "Hi ☃ there." and events[-1].response.output_text == text, text)

# Anthropic messages: thinking off, usage from the tokenizer.
r = an.messages.create(model="claude-sonnet-4-5", max_tokens=50, thinking={"type": "disabled"},
                       messages=[{"role": "user", "content": "Say hi."}],
                       extra_body={"ds4_test_script": "Hello there."})
check("anthropic text", [b.type for b in r.content] == ["text"] and r.content[0].text == "Hello there.", r)
check("anthropic stop", r.stop_reason == "end_turn", r)
u = r.usage
check("anthropic usage", u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
      == EXPECT["anthropic_prompt"], u)

# Anthropic tool use (thinking on), streamed, then the result sent back.
atools = [{"name": "bash", "description": "Run.", "input_schema": {"type": "object"}}]
amsgs = [{"role": "user", "content": "List files."}]
with an.messages.stream(model="claude-sonnet-4-5", max_tokens=200, tools=atools, messages=amsgs,
                        extra_body={"ds4_test_script": TOOL_SCRIPT}) as s:
    final = s.get_final_message()
check("anthropic stream blocks", [b.type for b in final.content] == ["thinking", "text", "tool_use"],
      final.content)
tu = final.content[2]
check("anthropic tool_use", tu.name == "bash" and tu.input == ARGS and tu.id.startswith("toolu_"), tu)
check("anthropic stop tool_use", final.stop_reason == "tool_use", final)
live = final.usage.cache_creation_input_tokens + final.usage.cache_read_input_tokens + final.usage.output_tokens
amsgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "a.c"}]}]
r = an.messages.create(model="claude-sonnet-4-5", max_tokens=30, tools=atools, messages=amsgs,
                       extra_body={"ds4_test_script": "Ok.</think>One file."})
check("anthropic replay cached", r.usage.cache_read_input_tokens == live, (r.usage, live))
check("anthropic replay answer", r.content[-1].text == "One file.", r.content)
print("all SDK checks passed")
