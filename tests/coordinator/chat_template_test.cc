// ChatTemplate: the Jinja subset real chat templates use, the kjv-llama fixture's own
// template, the built-in fallbacks, and clear errors for what is not supported.
#include "coordinator/api/chat_template.h"

#include <gtest/gtest.h>

#include "tests/test_support.h"

namespace tessera {
namespace {

std::string render(const std::string& source, const std::vector<ChatMessage>& messages, bool add_generation_prompt = false) {
  auto t = ChatTemplate::parse(source);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (!t.is_ok()) return "<parse error>";
  auto out = t->render(messages, add_generation_prompt);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out.value() : "<render error>";
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};

TEST(ChatTemplateTest, KjvLlamaFixtureTemplate) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = Tokenizer::load(testing::fixtures_dir() + "/kjv-llama");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  ASSERT_FALSE(tok.value()->chat_template().empty());
  auto t = ChatTemplate::for_tokenizer(*tok.value());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  // README section 4: <s>, then the contents joined by spaces, a system message first
  // followed by a space.
  auto out = t->render(kConversation, true);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value(), "<s>You are terse. Hi Hello. Bye");
  out = t->render({{"user", "In the beginning"}}, true);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out.value(), "<s>In the beginning");
  // Encoded without special tokens (the template already wrote <s>), the rendered <s> is the
  // BOS id. (The words after it are not at the text's origin, so Metaspace's "first" scheme
  // adds no leading U+2581 there, as in Hugging Face: "In" is 978, not "▁In" 299.)
  const std::vector<int32_t> ids = tok.value()->encode(out.value(), false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok.value()->bos_id());
  EXPECT_EQ(tok.value()->decode(ids, true), "In the beginning");
}

TEST(ChatTemplateTest, LoopVariablesConditionsAndFilters) {
  const std::vector<ChatMessage> m = {{"user", "  a  "}, {"assistant", "B"}, {"user", "c"}};
  EXPECT_EQ(render("{% for x in messages %}{{ loop.index0 }}{{ loop.index }}{% if loop.first %}F{% elif loop.last %}L{% else %}M{% endif %}{% endfor %}", m),
            "01F12M23L");
  EXPECT_EQ(render("{% for x in messages %}[{{ x.content | trim | upper }}]{% endfor %}", m), "[A][B][C]");
  EXPECT_EQ(render("{{ messages[1]['content'] | lower }}{{ messages | length }}{{ messages[-1].role }}", m), "b3user");
  EXPECT_EQ(render("{{ 'x' ~ 1 ~ true ~ none }}|{{ 'a' + 'b' }}|{{ 2 + 3 * 4 }}|{{ 7 // 2 }}{{ 7 % 3 }}", m), "x1TrueNone|ab|14|31");
  EXPECT_EQ(render("{% if not messages %}empty{% elif messages|length > 2 and messages[0].role == 'user' or false %}yes{% endif %}", m), "yes");
  EXPECT_EQ(render("{{ 'yes' if 'ss' in 'message' else 'no' }}{{ 'u' if 'user' not in ['a'] }}", m), "yesu");
  EXPECT_EQ(render("{% for x in messages[1:] %}{{ x.role[:1] }}{% endfor %}", m), "au");
  EXPECT_EQ(render("{{ foo is defined }}{{ foo is not defined }}{{ (foo or 'd') }}{{ foo | default('z') }}", m), "FalseTruedz");
  EXPECT_EQ(render("{{ messages[0].content.strip() }}{{ 'abc'.startswith('ab') }}", m), "aTrue");
}

TEST(ChatTemplateTest, SetScopingAndGenerationPrompt) {
  // A set inside a for loop does not leak out (Jinja scoping); a set outside does.
  EXPECT_EQ(render("{% set n = 'out' %}{% for x in messages %}{% set n = x.role %}{% endfor %}{{ n }}", kConversation), "out");
  EXPECT_EQ(render("{% if add_generation_prompt %}G{% endif %}", {}, true), "G");
  EXPECT_EQ(render("{% if add_generation_prompt %}G{% endif %}", {}, false), "");
  EXPECT_EQ(render("{% for x in messages %}{{ x.role }}{% else %}none{% endfor %}", {}), "none");
}

TEST(ChatTemplateTest, WhitespaceControlTrimAndLstripBlocks) {
  // transformers renders with trim_blocks and lstrip_blocks.
  const std::string src = "{% for x in messages %}\n    {% if x.role == 'user' %}\n[{{ x.content }}]\n    {% endif %}\n{% endfor %}";
  EXPECT_EQ(render(src, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}), "[a]\n[c]\n");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c", {}), "a b c");
  EXPECT_EQ(render("x\n  {%- if true %} y{% endif %}", {}), "x y");
  EXPECT_EQ(render("{# a comment #}z", {}), "z");
}

TEST(ChatTemplateTest, RaiseExceptionIsAnInvalidArgument) {
  auto t = ChatTemplate::parse("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto bad = t->render({{"assistant", "x"}}, false);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("first must be user"), std::string::npos);
  auto good = t->render({{"user", "x"}}, false);
  ASSERT_TRUE(good.is_ok());
  EXPECT_EQ(good.value(), "ok");
}

TEST(ChatTemplateTest, UnsupportedSyntaxNamesTheConstruct) {
  // What the subset used to refuse now renders (tests/coordinator/jinja_engine_test.cc);
  // what a chat template cannot use (other templates, unknown filters and tests) is refused
  // at parse time, naming the construct and its line.
  struct Case {
    std::string source, construct;
  };
  for (const Case& c : std::vector<Case>{{"{% include 'x.j2' %}", "include"},
                                         {"{% extends 'base' %}", "extends"},
                                         {"{% import 'm' as m %}", "import"},
                                         {"\n{{ x | frobnicate }}", "line 2: no filter named 'frobnicate'"},
                                         {"{{ x is frobnicated }}", "no test named 'frobnicated'"},
                                         {"{% for x in xs recursive %}{% endfor %}", "recursive"}}) {
    auto t = ChatTemplate::parse(c.source);
    ASSERT_FALSE(t.is_ok()) << c.source;
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << t.status().to_string();
    EXPECT_NE(t.status().message().find(c.construct), std::string::npos) << t.status().to_string();
  }
  for (const std::string src : {"{% if x %}", "{{ x", "{% endif %}", "{{ 'abc }}", "{% for x messages %}{% endfor %}"}) {
    auto t = ChatTemplate::parse(src);
    ASSERT_FALSE(t.is_ok()) << src;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().to_string();
  }
}

TEST(ChatTemplateTest, BuiltinLlama2) {
  auto t = ChatTemplate::builtin("llama2");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto out = t->render(kConversation, true);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value(), "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
  out = t->render({{"user", "Hi"}}, true);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out.value(), "<s>[INST] Hi [/INST]");
  auto bad = t->render({{"user", "a"}, {"user", "b"}}, true);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("alternate"), std::string::npos);
}

TEST(ChatTemplateTest, BuiltinChatml) {
  auto t = ChatTemplate::builtin("chatml");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto out = t->render({{"system", "S"}, {"user", "U"}}, true);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out.value(), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(ChatTemplate::builtin("vicuna").is_ok());
}

}  // namespace
}  // namespace tessera
