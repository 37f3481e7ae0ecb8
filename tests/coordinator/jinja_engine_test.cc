// The Jinja2 engine behind chat templates (coordinator/api/jinja/), one test per feature group.
// Expected strings follow Python Jinja2 3.1 with transformers' settings (trim_blocks,
// lstrip_blocks, one trailing newline dropped, tojson = json.dumps(ensure_ascii=False)).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "coordinator/api/chat_template.h"
#include "coordinator/api/jinja/template.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;

// The rendering, or "ERROR(<code>): <message>".
std::string render(const std::string& source, const std::string& context = "{}", jinja::RenderLimits limits = {}) {
  auto t = jinja::Template::parse(source);
  if (!t.is_ok()) return "ERROR(" + std::string(status_code_name(t.status().code())) + "): " + t.status().message();
  auto out = t->render(ordered_json::parse(context), limits);
  if (!out.is_ok()) return "ERROR(" + std::string(status_code_name(out.status().code())) + "): " + out.status().message();
  return out.value();
}

// Whether `text` contains `part` (for error messages).
::testing::AssertionResult has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

TEST(JinjaEngineTest, WhitespaceControl) {
  EXPECT_EQ(render("{% if true %}\nA\n{% endif %}\n"), "A\n");  // trim_blocks; one trailing \n dropped
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");        // lstrip_blocks at the start
  EXPECT_EQ(render("a\n    {% if true %}x\n    {% endif %}b"), "a\nx\nb");
  EXPECT_EQ(render("a\n  {%+ if true %}x{% endif %}"), "a\n  x");  // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");         // +%} keeps the newline
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render("x  {#- comment -#}  y"), "xy");
  EXPECT_EQ(render("a {{ 'b' }}\n\n"), "a b\n");
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");  // lstrip_blocks leaves {{ }} alone
  EXPECT_EQ(render("{% raw %}{{ x }}{% if %}{% endraw %}"), "{{ x }}{% if %}");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(JinjaEngineTest, TagEndsInsideStringsAndBrackets) {
  EXPECT_EQ(render("{{ '}}' }}|{{ \"%}\" }}"), "}}|%}");
  EXPECT_EQ(render("{{ {'a': {'b': 1}}['a']['b'] }}"), "1");
  EXPECT_EQ(render("{% set x = '{% endif %}' %}{{ x }}"), "{% endif %}");
}

TEST(JinjaEngineTest, LiteralsAndArithmetic) {
  EXPECT_EQ(render("{{ 1.5 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }}"),
            "1.5 3.5 2.0 3 -4 2 3.0");
  EXPECT_EQ(render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 1_000 }}"),
            "1024 0.5 1000.0 0.30000000000000004 1e+20 1.5e-07 1000");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.0] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) }} {{ (1,) }} {{ () }}"),
            "[1, 'a', None, True, 2.0] {'a': 1, 'b': [2]} (1, 2) (1,) ()");
  EXPECT_EQ(render("{{ [\"it's\", 'a\"b', 'x\\ny'] }}"), "[\"it's\", 'a\"b', 'x\\ny']");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ nothing }} {{ 'a' 'b' }}"), "ababab [1, 2] a1None ab");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] < [1, 3] }}"),
            "True False True True True True");
  EXPECT_EQ(render("{{ 'a\\tb\\u00e9\\x41' }}"), "a\tbéA");
  EXPECT_EQ(render("[{{ 'x' if false }}] {{ 1 if none else 2 }} {{ none or 'd' }} {{ 0 and 1 }} {{ not [] }}"),
            "[] 2 d 0 True");
  EXPECT_EQ(render("{{ '%s is %d' % ('x', 3) }} {{ '%s!' | format('hi') }}"), "x is 3 hi!");
  EXPECT_EQ(render("{{ -3 | abs }} {{ -(2 + 3) }}"), "3 -5");
}

TEST(JinjaEngineTest, UnicodeCodePoints) {
  const std::string ctx = R"({"s": "héllo👋"})";
  EXPECT_EQ(render("{{ s | length }} {{ s[1] }} {{ s[::-1] }} {{ s[-1] }} {{ s[1:3] }}", ctx), "6 é 👋olléh 👋 él");
  EXPECT_EQ(render("{{ 'ÉCOLE' | lower }} {{ 'straße'.upper() }} {{ 'ΟΔΟΣ' | lower }} {{ 'привет мир' | title }}"),
            "école STRASSE οδος Привет Мир");
  EXPECT_EQ(render("{{ 'ÀÉÎ' | lower | upper }} {{ 'ǅ' | length }}"), "ÀÉÎ 1");
  EXPECT_EQ(render("[{{ '\u3000 x \u00a0' | trim }}] [{{ '  y  '.strip() }}]"), "[x] [y]");
  EXPECT_EQ(render("{% for c in 'añ' %}[{{ c }}]{% endfor %} {{ 'añb' | list }}"), "[a][ñ] ['a', 'ñ', 'b']");
}

TEST(JinjaEngineTest, ToJsonAsTransformersDumps) {
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2.5, none, true]} | tojson }}"), R"({"b": 1, "a": [1, 2.5, null, true]})");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}"), "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ 'é<>&\\'\"\\n' | tojson }}"), R"("é<>&'\"\n")");  // no HTML escaping
  EXPECT_EQ(render("{{ [] | tojson(indent=4) }}{{ {} | tojson }}{{ none | tojson }}"), "[]{}null");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"z": {"y": 1}, "a": "👋"}})"), R"({"z": {"y": 1}, "a": "👋"})");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), R"({"a": 2, "b": 1})");
  EXPECT_EQ(render("{{ {'a': 'é'} | tojson(ensure_ascii=true, separators=(',', ':')) }}"), R"({"a":"\u00e9"})");
  EXPECT_TRUE(has(render("{{ nothing | tojson }}"), "'nothing' is undefined"));
}

TEST(JinjaEngineTest, SequenceFilters) {
  const std::string xs = R"({"xs": [{"n": "a", "t": 1}, {"n": "b", "t": 0}, {"n": "c", "t": 1}]})";
  EXPECT_EQ(render("{{ xs | selectattr('t') | map(attribute='n') | join(',') }}", xs), "a,c");
  EXPECT_EQ(render("{{ xs | rejectattr('t') | map(attribute='n') | join }}", xs), "b");
  EXPECT_EQ(render("{{ xs | selectattr('n', 'equalto', 'b') | list | length }}", xs), "1");
  EXPECT_EQ(render("{{ xs | map(attribute='n') | map('upper') | list }}", xs), "['A', 'B', 'C']");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('even') | list }} {{ [0, 1, ''] | reject | list }}"), "[2, 4] [0, '']");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'A': 2} | dictsort %}{{ k }}{% endfor %}"), "Ab");
  EXPECT_EQ(render("{{ ['b', 'A', 'a', 'c'] | unique | list }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}"),
            "['b', 'A', 'c'] ['A', 'b', 'c'] [3, 2, 1]");
  EXPECT_EQ(render("{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }} {{ ['B', 'a'] | max }} {{ xs | max(attribute='n') }}", xs),
            "13 B {'n': 'c', 't': 1}");
  EXPECT_EQ(render("{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}"),
            "13a [3, 2, 1] cba");
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }}"), "[[1, 2], [3, 4], [5]] [[1, 2], [3, 0]]");
  EXPECT_EQ(render("{{ [1, 2] | length }} {{ {'a': 1} | length }} {{ [1, 2, 3] | sum }} {{ xs | sum(attribute='t') }}", xs), "2 1 6 2");
  // A false value (none, undefined, 0, '') gives an empty list, as Jinja2's `if value:`
  // guard does (functionary's template sets tools = none, then selects from it).
  EXPECT_EQ(render("{{ none | selectattr('type', 'equalto', 'code') | list | length }} {{ nothing | map('upper') | list }} "
                   "{{ 0 | select | list }} {{ '' | rejectattr('a') | list }} {{ none | map(attribute='n') | list }}"),
            "0 [] [] [] []");
  EXPECT_EQ(render("{{ none | map('no_such_filter') | list }}"), "[]");  // arguments unread, as Jinja2
  EXPECT_TRUE(has(render("{{ 5 | select | list }}"), "not iterable"));
}

TEST(JinjaEngineTest, StringAndNumberFilters) {
  EXPECT_EQ(render("{{ '42' | int + 1 }} {{ '3.7' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ '2.5' | float * 2 }} {{ 3 | float }} {{ '0x1A' | int(0, 16) }}"),
            "43 3 0 5 5.0 3.0 26");
  EXPECT_EQ(render("{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 7 | round }}"), "2.0 3.14 3.0 7");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width=2, blank=true) }}|{{ 'a\nb' | indent('> ') }}"),
            "a\n  b\n\n  c|  a\n  b|a\n  \n  b|a\n> b");
  EXPECT_EQ(render("{{ 'Hello, wörld! 你好' | wordcount }}"), "3");
  EXPECT_EQ(render("[{{ '  Hi  ' | trim }}] {{ 'xxhixx' | trim('x') }} {{ 'hello WORLD-foo (bar)' | title }} {{ 'hELLO wORLD' | capitalize }}"),
            "[Hi] hi Hello World-Foo (Bar) Hello world");
  EXPECT_EQ(render("{{ nothing | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ nothing | d('e') }}"),
            "d None d e");
  EXPECT_EQ(render("{{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }} {{ 5 | string ~ 'x' }} {{ '<a>' | safe }} {{ '<&>' | escape }}"),
            "bba -a-b- 5x <a> &lt;&amp;&gt;");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
}

TEST(JinjaEngineTest, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
                   "{{ [] is iterable }}{{ 1 is number }}{{ 'a' is sequence }}{{ true is boolean }}{{ true is true }}"
                   "{{ false is false }}{{ 2 is eq 2 }}{{ 'a' is in 'abc' }}{{ 4 is divisibleby 2 }}{{ 3 is odd }}"
                   "{{ 1 is integer }}{{ 1.0 is float }}{{ true is integer }}{{ 1 is not none }}{{ range is callable }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ 3 is gt 2 }}{{ 3 is lt(2) }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 2 is ne 2 }}"), "TrueFalseTrueTrueFalse");
}

TEST(JinjaEngineTest, Loops) {
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}"), "1/2:2 2/2:4 ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }} {% endfor %}"), "-2 13 2- ");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.depth }}{{ loop.first }}{{ loop.last }} {% endfor %}"),
            "211TrueFalse 101FalseTrue ");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "013");
  EXPECT_EQ(render("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}"), "37");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %} {% for x in [1] if false %}x{% else %}none{% endfor %}"), "empty none");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{{ y }}{% endfor %}{{ loop.index }} {% endfor %}"), "1a2b1 1a2b2 ");
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}{% for x in nothing %}x{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for x in [1, 1, 2] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}"), "12");
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(3, 0, -1) | list }}"), "[0, 1, 2] [1, 4, 7] [3, 2, 1]");
  EXPECT_TRUE(has(render("{% for x in none %}{% endfor %}"), "'NoneType' object is not iterable"));
}

TEST(JinjaEngineTest, SetNamespaceAndScoping) {
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% set n = 1 %}{% for x in [5] %}{% set n = x %}{{ n }}{% endfor %}{{ n }}"), "51");
  EXPECT_EQ(render("{% set n = 1 %}{% if true %}{% set n = 2 %}{% endif %}{{ n }}"), "2");
  EXPECT_EQ(render("{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]{% set y | upper %}ab{% endset %}{{ y }}"), "[a1b]AB");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}"), "12(1, 2)");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}"), "12");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_TRUE(has(render("{% set d = {} %}{% set d.x = 1 %}"), "not a namespace() object"));
}

TEST(JinjaEngineTest, MacrosAndCallBlocks) {
  EXPECT_EQ(render("{% macro greet(name, greeting='Hi') %}{{ greeting }} {{ name }}{% endmacro %}"
                   "{{ greet('Bob') }}|{{ greet('Al', greeting='Yo') }}|{{ greet(greeting='Hey', name='C') }}|{{ greet() }}"),
            "Hi Bob|Yo Al|Hey C|Hi ");
  EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}"),
            "<b>bold</b>");
  EXPECT_EQ(render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}"),
            "[1][2]");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
  EXPECT_EQ(render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, k=2) }}"), "G(1,){'k': 2}");
  EXPECT_TRUE(has(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "macro calls nested deeper than 64"));
}

TEST(JinjaEngineTest, PythonMethods) {
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}"), "a b|axx|xxa");
  EXPECT_EQ(render("{{ 'a,b,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' a  b '.split() }} {{ 'a b c'.split(maxsplit=1) }}"),
            "['a', 'b', 'c'] ['a', 'b,c'] ['a', 'b'] ['a', 'b c']");
  EXPECT_EQ(render("{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith('b') }}"), "TrueTrueFalse");
  EXPECT_EQ(render("{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ '{} and {name}'.format(1, name='x') }} {{ '{1}{0}'.format('a', 'b') }}"),
            "a+b+c a+b-c 1 and x ba");
  EXPECT_EQ(render("{{ 'hello world'.title() }} {{ 'they\\'re 1st'.title() }} {{ 'ab'.upper() }}{{ 'AB'.lower() }}"),
            "Hello World They'Re 1St ABab");
  EXPECT_EQ(render("{{ 'abcabc'.find('c') }}{{ 'abcabc'.count('bc') }}{{ '-'.join(['a', 'b']) }} {{ 'héllo'.find('l') }} {{ 'x'.find('y') }}"),
            "22a-b 2 -1");
  const std::string d = R"({"d": {"a": 1, "b": 2}})";
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.keys() | list }}|{{ d.values() | list }}|"
                   "{{ d.get('a') }}{{ d.get('z', 'none') }}{{ d.get('z') }}|{{ d['a'] }}{{ d.b }}",
                   d),
            "a1b2|['a', 'b']|[1, 2]|1noneNone|12");
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(1) %}{{ l.append(2) }}{{ l }}"), "None[1, 2]");
  EXPECT_EQ(render("{% set l = ['a', 'b', 'c', 'd'] %}{{ l.pop(0) }}{{ l.pop() }}{{ l.pop(-2) }}{{ l }}"), "adb['c']");
  EXPECT_EQ(render("{{ [].pop() }}"), "ERROR(InvalidArgument): line 1: pop from empty list");
  EXPECT_EQ(render("{{ [1].pop(1) }}"), "ERROR(InvalidArgument): line 1: pop index out of range");
  EXPECT_EQ(render("{{ [1].pop('0') }}"), "ERROR(InvalidArgument): line 1: 'str' object cannot be interpreted as an integer");
}

TEST(JinjaEngineTest, UndefinedAsJinja2Default) {
  const std::string d = R"({"d": {"a": 1}, "n": null})";
  EXPECT_EQ(render("[{{ missing }}]{{ missing is defined }}{% for x in missing %}x{% endfor %}{{ missing | length }}"
                   "{{ 'y' if missing else 'n' }}{{ d.missing }}{{ d['missing'] is defined }}{{ n.attr is defined }}",
                   d),
            "[]False0nFalseFalse");
  EXPECT_TRUE(has(render("{{ missing.attr }}"), "'missing' is undefined"));
  EXPECT_TRUE(has(render("{{ d.missing.deeper }}", d), "'dict object' has no attribute 'missing'"));
  EXPECT_TRUE(has(render("{{ missing + 1 }}"), "'missing' is undefined"));
  EXPECT_TRUE(has(render("{{ n.strip() }}", d), "'None' has no attribute 'strip'"));
}

TEST(JinjaEngineTest, GlobalsAndErrors) {
  jinja::RenderLimits pinned;
  std::tm tm{};
  tm.tm_year = 124;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_wday = 5;
  pinned.fixed_now = tm;
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }} {{ strftime_now('%A') }}", "{}", pinned), "26 Jul 2024 Friday");
  EXPECT_EQ(render("{{ raise_exception('Only user and assistant roles are supported!') }}"),
            "ERROR(InvalidArgument): Only user and assistant roles are supported!");
  EXPECT_EQ(render("{{ dict(a=1) }} {% set j = joiner('|') %}{{ j() }}a{{ j() }}b"), "{'a': 1} a|b");
  // Parse errors name the line and the construct.
  EXPECT_EQ(render("a\n{% if x %}\n{% endfor %}"), "ERROR(InvalidArgument): line 3: unexpected {% endfor %}");
  EXPECT_EQ(render("\n\n{{ x | nosuchfilter }}"), "ERROR(Unimplemented): line 3: no filter named 'nosuchfilter'");
  // ... except inside an {% if %} or a conditional expression, where Jinja2 looks the name up
  // only when the filter runs (templates keep other engines' filters, llama.cpp's from_json,
  // in branches that do not run); loops, macros and filter blocks are strict again.
  EXPECT_EQ(render("{% if false %}{{ x | from_json }}{% elif false %}{{ x is fancy }}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{{ x | from_json if false else 'b' }}{% if false %}{% set y = x | zz %}{% endif %}"), "b");
  EXPECT_EQ(render("{% macro m() %}{% if false %}{{ 1 | zz }}{% endif %}{% endmacro %}m"), "m");
  EXPECT_EQ(render("{% if true %}\n{{ '{}' | from_json }}{% endif %}"), "ERROR(InvalidArgument): line 2: no filter named 'from_json'");
  EXPECT_EQ(render("{{ (1 is fancy) if true else 2 }}"), "ERROR(InvalidArgument): line 1: no test named 'fancy'");
  EXPECT_EQ(render("{% if x %}{% for i in y %}{{ i | zz }}{% endfor %}{% endif %}"), "ERROR(Unimplemented): line 1: no filter named 'zz'");
  EXPECT_EQ(render("{% if false %}{% filter zz %}a{% endfilter %}{% endif %}"), "ERROR(Unimplemented): line 1: no filter named 'zz'");
  EXPECT_EQ(render("{{ x is fancy }}"), "ERROR(Unimplemented): line 1: no test named 'fancy'");
  EXPECT_EQ(render("{% if x %}\nopen"), "ERROR(InvalidArgument): line 2: unexpected end of template: expected {% endif %} for the block opened on line 1");
  EXPECT_EQ(render("{% do x %}"), "ERROR(InvalidArgument): line 1: unknown tag 'do' (transformers does not enable Jinja2's do extension)");
  // Render errors: Python's wording, with the line.
  EXPECT_EQ(render("\n{{ 'a' + 1 }}"), "ERROR(InvalidArgument): line 2: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(render("{{ 1 / 0 }}"), "ERROR(InvalidArgument): line 1: division by zero");
  EXPECT_EQ(render("{{ 1 < 'a' }}"), "ERROR(InvalidArgument): line 1: '<' not supported between instances of 'int' and 'str'");
}

// Dict keys are any hashable value, matched as Python matches them (ByteDance Seed-OSS's
// template looks a budget up in a dict of integers).
TEST(JinjaEngineTest, DictKeysBeyondStrings) {
  EXPECT_EQ(render("{% set m = {0: 0, 512: 128, 1024: 256} %}{{ m[512] }} {{ m }} "
                   "{% for k, v in m | dictsort(reverse=true) %}{{ k }}={{ v }},{% endfor %}"),
            "128 {0: 0, 512: 128, 1024: 256} 1024=256,512=128,0=0,");
  EXPECT_EQ(render("{% set m = {1: 'a', True: 'b', 1.0: 'c', '1': 'd'} %}{{ m }} {{ m | length }} "
                   "{{ 1 in m }} {{ '1' in m }} {{ 2 in m }}"),
            "{1: 'c', '1': 'd'} 2 True True False");
  EXPECT_EQ(render("{% set m = {none: 'n', (1, 'x'): 't', 2.5: 'f'} %}{{ m[none] }}{{ m[(1, 'x')] }}{{ m[2.5] }} "
                   "{{ m.get(2.5) }} {{ m.get(3, 'd') }}"),
            "ntf f d");
  // json.dumps writes scalar keys as strings.
  EXPECT_EQ(render("{{ {1: 'a', 'b': [2], true: none, 1.5: 0} | tojson }}"), R"({"1": null, "b": [2], "1.5": 0})");
  EXPECT_EQ(render("{{ {2: 'x', 10: 'y'} | tojson(sort_keys=true) }}"), R"({"2": "x", "10": "y"})");
  EXPECT_EQ(render("{{ {2: 'x'} == {2.0: 'x'} }} {{ {2: 'x'} == {'2': 'x'} }} {{ {2: 'x'}.items() | list }} "
                   "{{ dict({3: 4}) }} {{ {3: 'a'}[4] is defined }}"),
            "True False [(2, 'x')] {3: 4} False");
  EXPECT_EQ(render("{{ {[1]: 2} }}"), "ERROR(InvalidArgument): line 1: unhashable type: 'list'");
  EXPECT_TRUE(has(render("{{ {2: 'x', 'a': 'y'} | tojson(sort_keys=true) }}"), "'<' not supported between instances of"));
  EXPECT_EQ(render("{{ {(1, 2): 3} | tojson }}"),
            "ERROR(InvalidArgument): line 1: keys must be str, int, float, bool or None, not tuple");
}

// |safe and |escape return markupsafe's Markup; + with a plain string escapes the plain one
// even with autoescape off (functionary v3.1's template builds its tool list this way).
TEST(JinjaEngineTest, MarkupConcatenationEscapesThePlainSide) {
  EXPECT_EQ(render("{{ 'a<'|safe + '<b' + 'c>' }}"), "a<&lt;bc&gt;");
  EXPECT_EQ(render("{{ '<x>' + '&'|safe }}"), "&lt;x&gt;&");
  EXPECT_EQ(render("{{ '\"q\"'|safe + {'k': 'v'}|tojson }}"), "\"q\"{&#34;k&#34;: &#34;v&#34;}");
  EXPECT_EQ(render("{{ ('<'|e) | e }} {{ ('<'|e) | forceescape }}"), "&lt; &amp;lt;");
  EXPECT_EQ(render("{{ '<'|safe ~ '>' }} {{ '<'|safe == '<' }} {{ '<' + '>' }}"), "<> True <>");
}

TEST(JinjaEngineTest, LimitsAreClearErrors) {
  jinja::RenderLimits small;
  small.max_output_bytes = 1 << 20;
  EXPECT_TRUE(has(render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "{}", small), "output exceeds 1048576 bytes"));
  small.max_steps = 10000;
  EXPECT_TRUE(has(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "{}", small),
                  "more than 10000 steps"));
  EXPECT_TRUE(has(render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"), "nested deeper than 128"));
  EXPECT_TRUE(has(render(std::string(300, '{') + "% if true %}"), "ERROR"));
  EXPECT_TRUE(has(render("{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}"),
                  "nested deeper than 200 levels"));
  EXPECT_TRUE(has(render("{{ 9223372036854775807 + 1 }}"), "integer overflow"));
}

TEST(JinjaEngineTest, ChatTemplateTakesTheWholeContext) {
  auto t = ChatTemplate::parse(
      "{{ bos_token }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}|"
      "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% elif m.content is none %}None{% else %}"
      "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}"
      "{% for c in m.tool_calls | default([]) %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}"
      "{{ m.tool_call_id | default('') }};{% endfor %}{{ extra }}");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto out = t->render(ordered_json::parse(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "extra": "X"})"));
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value(), "<s>TrueTrueFalse|user:ab;assistant:Nonef{\"z\": 1, \"a\": 2};tool:okc1;X");
  auto with_tools = t->render(ordered_json::parse(R"({"messages": [], "tools": [], "bos_token": "B", "add_generation_prompt": true})"));
  ASSERT_TRUE(with_tools.is_ok());
  EXPECT_EQ(with_tools.value(), "BFalseTrueTrue|");
  EXPECT_FALSE(t->render(ordered_json::parse(R"({"tools": []})")).is_ok());  // messages are required
}

}  // namespace
}  // namespace tessera
