"""Chat templates that take tools, in the two formats agentctx.agent parses. Written for the
tests (the default model's own template takes no tools): ChatML turns, with the tool schemas
in the system turn, assistant tool calls rendered back in the model's own format, and tool
results as turns of their own."""

HERMES = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call tools. Their signatures:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
To call one, reply with <tool_call>{"name": NAME, "arguments": {...}}</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}
{%- for c in m.tool_calls or [] %}<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

JSON = """\
{%- if messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}
{%- if tools %}

Call a tool by replying with only a JSON object {"name": NAME, "parameters": {...}}. Tools:
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}<|im_end|>
{% endif -%}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>ipython
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
