#!/usr/bin/env python3
"""Writes jinja_cases.jsonl: small templates rendered by jinja2 itself.

Run with jinja2 3.1.6 (the version transformers 5.17 used for the
reference renderings):  python3 tests/chat/make_jinja_cases.py

The environment is configured as transformers configures it for chat
templates: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), tojson replaced by
json.dumps(ensure_ascii=False, ...), raise_exception() as a global.
Each line: {"name", "template", "context", "text"} or {..., "error"}
("Kind: message" of the exception jinja2 raised).
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": [True, None, 1.5]}}}]}]

CASES = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("ws_plain", "a\n{% if true %}\nb\n{% endif %}\nc\n", {}),
    ("ws_lstrip", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c", {}),
    ("ws_plus", "a\n    {%+ if true %}\nb{% endif +%}\nc", {}),
    ("ws_var_no_trim", "a {{ 'x' }}\nb\n  {{ 'y' }}  \n", {}),
    ("ws_var_minus", "a \n {{- 'x' -}} \n b", {}),
    ("ws_comment", "a\n  {# c #}\nb {#- c -#} c", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("ws_unicode_minus", "a\u3000\u00a0 {{- 'x' -}} \u2003b", {}),
    ("ws_raw", "{% raw %}{{ x }}{% endraw %}|{%- raw -%}  {% y %}  {%- endraw %}|", {}),
    ("ws_two_trailing_newlines", "x\n\n", {}),
    # output of values
    ("out_values", "{{ none }} {{ true }} {{ false }} {{ 1 }} {{ 1.0 }} {{ 1.5e20 }} {{ 0.0001 }} {{ 1e-5 }} {{ 'a' }} {{ undefined_var }}|", {}),
    ("out_containers", "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': none} }} {{ (1,) }} {{ (1, 'b') }} {{ [] }} {{ {} }}", {}),
    ("out_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n', '\\x01\\x7f', '\u00e9\u4e2d\U0001F600', '\u00a0\u3000\u200b'] }}", {}),
    ("out_json_ctx", "{{ m }}", {"m": MSGS}),
    ("out_floats", "{{ [0.1, 100.0, 1e16, 1.2345678901234567e-7, -0.0, 123456789012345.6, 2.5e-4] }}", {}),
    # string filters and methods
    ("str_methods", "{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}|{{ 'a\\n\\n'.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a</think>b</think>c'.split('</think>')[-1] }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'MiX'.upper() }}{{ 'MiX'.lower() }}", {}),
    ("str_unicode_strip", "[{{ s.strip() }}][{{ s|trim }}][{{ s.lstrip() }}]", {"s": "\u3000\u00a0\u2003\x1f text \x85\u2028"}),
    ("str_index_slice", "{{ s[0] }}{{ s[-1] }}|{{ s[::-1] }}|{{ s[1:3] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ s[10:] }}|{{ s[-10:2] }}", {"s": "h\u00e9llo\U0001F600"}),
    ("list_index_slice", "{{ l[0] }} {{ l[-1] }} {{ l[::-1] }} {{ l[1:] }} {{ l[:-2] }} {{ l[5:1:-2] }} {{ l[-100:100] }} {{ l[10] is defined }}", {"l": [1, 2, 3, 4, 5, 6]}),
    ("filters_misc", "{{ 'abc'|length }} {{ [1,2]|length }} {{ {'a':1}|length }} {{ x|length }} {{ 'a\u00e9'|length }}|{{ 5|string }}{{ none|string }}{{ true|string }}{{ [1,'a']|string }}|{{ ' x '|trim }}|{{ 'A'|lower }}{{ 'b'|upper }}|{{ x|default('d') }}{{ ''|default('e', true) }}|{{ [1,2,3]|join('-') }}|{{ [3,4]|first }}{{ [3,4]|last }}|{{ 'ab'|list }}|{{ [1,2]|reverse|list }}|{{ 'hello world'|capitalize }}|{{ 'a-b'|replace('-', '+') }}", {}),
    ("filter_items", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.keys()|list }}{{ d.values()|list }}|{{ d.get('z', 9) }}{{ d.get('b') }}", {"d": {"b": 2, "a": [1], "c": None}}),
    ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}|{{ [1.0, 1e100, none, true]|tojson }}|{{ d|tojson(separators=(',', ':')) }}", {"d": {"z": 1, "a": {"y": [1, 2], "x": {}}, "e": []}, "s": "\u00e9\"\\\n\t\x01\x1f\u2028\U0001F600</tag>"}),
    ("tojson_undefined", "{{ nothing|tojson }}", {}),
    ("safe_string", "{{ x|tojson|safe }}{{ 3|safe }}", {"x": {"a": "b"}}),
    # tests
    ("tests", "{% for v in vals %}{{ v is defined }}{{ v is none }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is false }}{{ v is true }}{{ v is number }};{% endfor %}{{ nope is defined }}{{ nope is undefined }}{{ nope is iterable }}", {"vals": [None, "s", {"a": 1}, [1], True, False, 0, 1.5, ""]}),
    ("tests_not", "{{ 1 is not none }}{{ x is not defined }}{{ 'a' is not string }}{{ 3 is odd }}{{ 3 is even }}{{ 4 is divisibleby 2 }}{{ 'a' is eq 'a' }}{{ 1 is in [1,2] }}{{ 'ab' is lower }}", {}),
    # operators
    ("ops_arith", "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ true + 1 }} {{ -(3) }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1] + [2] }} {{ 'ab' * 2 }}", {}),
    ("ops_compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ none == none }} {{ true == 1 }} {{ x == y }}", {}),
    ("ops_logic", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }} {{ none or none }}|{{ not 0 }} {{ not [] }} {{ not 'a' }}|{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if 0 }}]", {}),
    ("ops_precedence", "{{ l|length - 1 }} {{ not l|length }} {{ 'a' ~ 'b' if false else 'c' ~ 'd' }} {{ -2 ** 2 }} {{ 2 + 3 is odd }}", {"l": [1, 2, 3]}),
    ("concat_str_list_error", "{{ 'a' + ['b'] }}", {}),
    ("concat_list_str_error", "{{ l + 'x' }}", {"l": [1]}),
    ("add_undefined_error", "{{ d.missing + 'x' }}", {"d": {"a": 1}}),
    ("in_none_error", "{{ 'a' in none }}", {}),
    ("in_int_error", "{{ 'a' in 5 }}", {}),
    ("attr_of_undefined_error", "{{ d.missing.more }}", {"d": {}}),
    ("method_on_list_error", "{{ l.startswith('a') }}", {"l": [1]}),
    ("undefined_name_call_error", "{{ nosuch('a') }}", {}),
    ("int_str_add_error", "{{ 1 + 'a' }}", {}),
    ("compare_error", "{{ 1 < 'a' }}", {}),
    ("iterate_none_error", "{% for x in none %}{% endfor %}", {}),
    ("div_zero_error", "{{ 1 // 0 }}", {}),
    ("items_of_string_error", "{% for a, b in 'xy'|items %}{% endfor %}", {}),
    ("unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("raise", "a{{ raise_exception('Custom message: ' ~ 42) }}", {}),
    ("raise_in_macro", "{% macro m(x) %}{% if x %}{{ raise_exception('bad x') }}{% endif %}{% endmacro %}{{ m(0) }}-{{ m(1) }}", {}),
    # loops
    ("loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}];{% endfor %}", {}),
    ("loop_object", "{% for x in 'ab' %}{{ loop }} {{ loop is mapping }} {{ loop|length }} {{ loop['index0'] }} {{ loop.length is number }};{% endfor %}", {}),
    ("loop_filter_else", "{% for x in l if x % 2 %}{{ x }}{{ loop.index }}{{ loop.length }}{{ loop.last }},{% else %}empty{% endfor %}|{% for x in [] %}x{% else %}none{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_tuple_unpack", "{% for a, b in [[1, 'x'], (2, 'y')] %}{{ a }}{{ b }}{% endfor %}{% for k, v in {'p': 1}.items() %}{{ k }}{{ v }}{% endfor %}", {}),
    ("loop_dict_iter", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("scope_loop_set", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}", {}),
    ("scope_loop_set_partial", "{% for i in [1, 2, 3] %}{% if loop.first %}{% set y = 'first' %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]", {}),
    ("scope_if_set", "{% if true %}{% set z = 5 %}{% endif %}{{ z }}", {}),
    ("scope_loop_var_reassign", "{% for t in l %}{% if t.function %}{% set t = t.function %}{% endif %}{{ t.name }};{% endfor %}", {"l": [{"function": {"name": "f"}}, {"name": "g"}]}),
    ("namespace", "{% set ns = namespace(a=1, b='x') %}{% for i in [1, 2, 3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{% set ns.c = 'new' %}{{ ns.c }}", {}),
    ("namespace_in_macro", "{% set c = namespace(v=0) %}{% macro inc() %}{% set c.v = c.v + 1 %}{{ c.v }}{% endmacro %}{{ inc() }}{{ inc() }}{{ c.v }}", {}),
    ("set_tuple_and_block", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %}  x {{ a }} {% endset %}[{{ blk }}]{% set up | upper %}abc{% endset %}{{ up }}", {}),
    ("macro_defaults", "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='y') }}|{{ m() }}|{% set r = m(5)|trim %}{{ r ~ '!' }}", {}),
    ("macro_caller", "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}", {}),
    ("macro_whitespace", "{% macro m(x) %}\n    {{- x }}\n    {% if x %}\n        yes\n    {% endif %}\n{% endmacro %}[{{ m(1) }}]", {}),
    ("call_block_undefined_error", "{% call nosuch('b') %}x{% endcall %}", {}),
    ("call_block_arg_error", "{% macro w(t) %}{{ caller() }}{% endmacro %}{% call w(1 + 'a') %}x{% endcall %}", {}),
    ("macro_too_many_args_error", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("literals", "{{ [1, [2, [3]]] }} {{ {'a': [1, {'b': none}]} }} {{ (1, 2)[1] }} {{ 'con' 'cat' }} {{ 1_000 }} {{ 0.5 }} {{ True }} {{ None }}", {}),
    ("string_escapes", "{{ 'a\\tb\\\\c\\'d\\\"e\\x41\\u00e9\\U0001F600\\101' }}|{{ \"q'\" }}", {}),
    ("attr_vs_item", "{{ d.a }} {{ d['a'] }} {{ d.items is defined }} {{ l.0 }} {{ d['missing'] is defined }}", {"d": {"a": 1}, "l": [7]}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0, false] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if nope else 'F' }}", {}),
    ("range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }}", {}),
    ("output_tuple", "{{ 1, 'a' }}", {}),
    ("chained_filters_cond", "{% for v in [{'a': 1}, [1, 'x'], 'str', 5, none, true] %}{{ v | tojson | safe if v is mapping or (v is sequence and v is not string) else v | string }};{% endfor %}", {}),
    ("undefined_behaviour", "[{{ u }}][{{ u|length }}][{{ u|trim }}][{{ u ~ 'x' }}][{{ u is none }}][{% for x in u %}x{% endfor %}][{{ 'a' in u }}][{{ u == u }}][{{ not u }}]", {}),
    ("more_ws", "x\n\t {% if true %}\t\ny{%- if true %}\n z{% endif %}\n{% endif %}\n  {#- c -#}  \n q {% if true -%}\n\n r{%+ endif %} s\n", {}),
    ("ws_text_before_tag", "a {% if true %}b{% endif %} c\n  d {% if true %}\n{% endif %}e", {}),
    ("multiline_tags", "{{\n  'a'\n  ~ 'b'\n}}{%\n if true\n%}c{% endif\n%}", {}),
    ("literal_braces", "{{ '{{' }}x{{ '}}' }} {{ '{% raw %}' }} {{ \"%s\" }}", {}),
    ("numbers", "{{ 10 / 4 }} {{ 4 / 2 }} {{ 1e3 }} {{ 2 * -1 }} {{ -1 }} {{ 0.1 + 0.2 }} {{ 7 % -3 }} {{ 2 ** -1 }} {{ 1_0.5 }}", {}),
    ("in_tuple_and_nested", "{{ 'a' in ('a', 'b') }} {{ [1] in [[1], 2] }} {{ none in [none] }} {{ m[0]['role'] }} {{ m[0].get('role') }}", {"m": [{"role": "r"}]}),
    ("none_attr", "{{ none.x is defined }} {{ (none).x is undefined }}", {}),
    ("filtered_loop_items", "{% for m in ms if m.role != 'system' %}{{ loop.index0 }}{{ m.role }}{{ loop.previtem.role if loop.previtem is defined else '-' }}{{ loop.nextitem is defined }};{% endfor %}", {"ms": [{"role": "system"}, {"role": "user"}, {"role": "system"}, {"role": "assistant"}]}),
    ("macro_calls_later_macro", "{% macro a(x) %}[{{ b(x) }}]{% endmacro %}{% macro b(y) %}{{ y * 2 }}{% endmacro %}{{ a(3) }}", {}),
    ("set_shadows_context", "{% set x = x + 1 %}{{ x }}{% for i in [1] %}{{ x }}{% endfor %}", {"x": 41}),
    ("default_filter_variants", "{{ none|default('d') }} {{ u|default(none) }} {{ false|default('e', true) }} {{ u|d('f') }}", {}),
    ("join_variants", "{{ ['a', 1, none]|join(', ') }} {{ 'abc'|join('.') }} {{ ', '.join(['x', 'y']) }}", {}),
    ("string_methods_more", "{{ 'a-b-c'.split('-', 1) }} {{ '  x  y '.split(None, 1) }} {{ 'abc'.find('c') }} {{ 'aaa'.count('a') }} {{ 'ab'.replace('', '-') }} {{ 'Hello World'.title() }} {{ '12'.isdigit() }}", {}),
    ("str_of_floats_in_concat", "{{ 'v' ~ 1.0 ~ 1e20 ~ 1e-7 ~ (1/3) }}", {}),
    ("compare_chains_mixed", "{{ 1 < 2 == 2 }} {{ 'a' != 'b' != 'a' }} {{ 1 in [1] == true }}", {}),
    ("undefined_compare_error", "{{ u < 1 }}", {}),
    ("neg_undefined_error", "{{ -u }}", {}),
    ("index_undefined_error", "{{ u[0] }}", {}),
    ("str_index_out_of_range", "[{{ 'ab'[5] }}] {{ [1][3] is defined }}", {}),
    ("slice_none_step", "{{ [1,2,3][None:None:-1] }} {{ 'abc'[-1:-4:-1] }}", {}),
    ("syntax_unknown_tag_error", "{% foo %}", {}),
    ("syntax_unclosed_error", "{% if true %}x", {}),
    ("syntax_unknown_filter_error", "{{ x|nosuchfilter }}", {}),
]


def main():
    out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jinja_cases.jsonl")
    with open(out_path, "w", encoding="utf-8") as out:
        for name, src, ctx in CASES:
            row = {"name": name, "template": src, "context": ctx}
            try:
                row["text"] = env.from_string(src).render(**ctx)
            except Exception as e:  # noqa: BLE001 - recorded as the expected failure
                row["error"] = f"{type(e).__name__}: {e}"
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases to {out_path} (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    main()
