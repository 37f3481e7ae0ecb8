// A reasoning model's thoughts told from its answer (coordinator/api/reasoning/): where the
// output starts (the prompt's open <think>, or the output opening one), the first </think>
// ending the thoughts, an output cut inside them, and the same split however a stream cuts
// the text — one byte at a time, or at any single point.
#include "coordinator/api/reasoning/reasoning_parser.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace tessera {
namespace {

struct Case {
  const char* output;
  bool starts_in;
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};

// The split of `text` fed in the pieces that `cuts` (ascending byte offsets) make.
SplitReasoning split_in_pieces(const std::string& text, bool starts_in, const std::vector<size_t>& cuts,
                               ReasoningFormat format = ReasoningFormat::kThinkTags) {
  ReasoningStream stream(starts_in, format);
  std::string reasoning, content;
  size_t from = 0;
  for (size_t cut : cuts) {
    const ReasoningDelta d = stream.feed(std::string_view(text).substr(from, cut - from));
    reasoning += d.reasoning;
    content += d.content;
    from = cut;
  }
  ReasoningDelta d = stream.feed(std::string_view(text).substr(from));
  reasoning += d.reasoning;
  content += d.content;
  d = stream.finish();
  reasoning += d.reasoning;
  content += d.content;
  SplitReasoning split;
  if (stream.had_reasoning()) split.reasoning = reasoning;
  if (!stream.in_reasoning()) split.content = content;
  return split;
}

TEST(ReasoningParser, ThoughtsAndAnswerSplitTheSameHoweverTheStreamIsCut) {
  const Case cases[] = {
      // Qwen3: the output opens its thoughts; whitespace after </think> is dropped.
      {"<think>\nWhich city?\n</think>\n\nParis.", false, "\nWhich city?\n", "Paris."},
      {"  <think>a</think>b", false, "a", "b"},
      // No thoughts at all, or a closed block in the prompt: all answer.
      {"Paris.", false, std::nullopt, "Paris."},
      {"<thin", false, std::nullopt, "<thin"},
      {"", false, std::nullopt, ""},
      // DeepSeek-R1: the prompt left <think> open; an opening tag the model writes anyway is dropped.
      {"Which city?</think>Paris.", true, "Which city?", "Paris."},
      {"<think>\nWhich city?</think>Paris.", true, "\nWhich city?", "Paris."},
      {"\nWhich city?</think>\n", true, "\nWhich city?", ""},
      // Cut inside the thoughts: no answer.
      {"<think>Which ci", false, "Which ci", std::nullopt},
      {"Which ci</thi", true, "Which ci</thi", std::nullopt},
      // Only the first </think> ends them; an empty block is still a block.
      {"<think></think>A </think> B", false, "", "A </think> B"},
      {"<think>x</think><think>y</think>", false, "x", "<think>y</think>"},
  };
  for (const Case& c : cases) {
    const std::string text = c.output;
    const SplitReasoning whole = split_reasoning(text, c.starts_in);
    EXPECT_EQ(whole.reasoning, c.reasoning) << text;
    EXPECT_EQ(whole.content, c.content) << text;
    std::vector<size_t> every_byte;
    for (size_t i = 1; i < text.size(); ++i) every_byte.push_back(i);
    const SplitReasoning bytes = split_in_pieces(text, c.starts_in, every_byte);
    EXPECT_EQ(bytes.reasoning, c.reasoning) << text << " byte by byte";
    EXPECT_EQ(bytes.content, c.content) << text << " byte by byte";
    for (size_t cut = 1; cut < text.size(); ++cut) {
      const SplitReasoning two = split_in_pieces(text, c.starts_in, {cut});
      EXPECT_EQ(two.reasoning, c.reasoning) << text << " cut at " << cut;
      EXPECT_EQ(two.content, c.content) << text << " cut at " << cut;
    }
  }
}

TEST(ReasoningParser, TheStreamHoldsBackOnlyWhatMayBeAMarker) {
  ReasoningStream stream(true);
  ReasoningDelta d = stream.feed("I think</th");
  EXPECT_EQ(d.reasoning, "I think");  // "</th" may begin </think>
  d = stream.feed("ere");
  EXPECT_EQ(d.reasoning, "</there");
  d = stream.feed("</think>\n\nAns");
  EXPECT_EQ(d.content, "Ans");
  EXPECT_FALSE(stream.in_reasoning());
}

TEST(ReasoningParser, WhereTheOutputStartsAndWhichSettingSelectsIt) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
  EXPECT_EQ(reasoning_format_for_template("{{ '<think>' }}"), ReasoningFormat::kThinkTags);
  EXPECT_EQ(reasoning_format_for_template("{% set c = c.split('</think>')[-1] %}"), ReasoningFormat::kThinkTags);
  EXPECT_EQ(reasoning_format_for_template("{{ messages }}"), ReasoningFormat::kNone);
  EXPECT_EQ(reasoning_format_from_setting("auto").value(), std::nullopt);
  EXPECT_EQ(reasoning_format_from_setting("qwen3").value(), ReasoningFormat::kThinkTags);
  EXPECT_EQ(reasoning_format_from_setting("deepseek_r1").value(), ReasoningFormat::kThinkTags);
  EXPECT_EQ(reasoning_format_from_setting("none").value(), ReasoningFormat::kNone);
  EXPECT_EQ(reasoning_format_from_setting("gpt_oss").value(), ReasoningFormat::kHarmony);
  EXPECT_EQ(reasoning_format_for_template("{{ '<|start|>assistant<|channel|>final<|message|>' }}"),
            ReasoningFormat::kHarmony);
  const Status bad = reasoning_format_from_setting("gpt-oss").status();
  EXPECT_NE(bad.message().find("server.reasoning_parser: 'gpt-oss'"), std::string::npos) << bad.to_string();
  EXPECT_NE(bad.message().find("gpt_oss"), std::string::npos) << bad.to_string();
}

// gpt-oss's harmony messages: analysis is thought, final and commentary preambles are answer,
// a message to a function is written for the "openai" tool-call parser; the same split
// however the stream cuts the text, and an output cut inside the analysis has no answer.
TEST(ReasoningParser, HarmonyChannelsSplitTheSameHoweverTheStreamIsCut) {
  const std::string call = "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\"}<|call|>";
  const Case cases[] = {
      {"<|channel|>analysis<|message|>Which city?<|end|><|start|>assistant<|channel|>final<|message|>Paris.", false,
       "Which city?", "Paris."},
      // Two analysis messages, a preamble, then the answer ended by <|return|> kept in the text.
      {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
       "<|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>"
       "<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
       false, "ab", "Looking.Done."},
      // A call: the recipient before or after the channel, a constrain marker, the call token ending it.
      {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
       false, "Need weather.", call},
      {"<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary "
       "json<|message|>{\"city\": \"Paris\"}",
       false, "x", call},
      // Cut inside the analysis; a plain answer with no header; nothing at all.
      {"<|channel|>analysis<|message|>Which ci", false, "Which ci", std::nullopt},
      {"Paris.", false, std::nullopt, "Paris."},
      {"<|chan", false, std::nullopt, "<|chan"},
      {"", false, std::nullopt, ""},
  };
  for (const Case& c : cases) {
    const std::string text = c.output;
    const SplitReasoning whole = split_reasoning(text, false, ReasoningFormat::kHarmony);
    EXPECT_EQ(whole.reasoning, c.reasoning) << text;
    EXPECT_EQ(whole.content, c.content) << text;
    std::vector<size_t> every_byte;
    for (size_t i = 1; i < text.size(); ++i) every_byte.push_back(i);
    const SplitReasoning bytes = split_in_pieces(text, false, every_byte, ReasoningFormat::kHarmony);
    EXPECT_EQ(bytes.reasoning, c.reasoning) << text << " byte by byte";
    EXPECT_EQ(bytes.content, c.content) << text << " byte by byte";
    for (size_t cut = 1; cut < text.size(); ++cut) {
      const SplitReasoning two = split_in_pieces(text, false, {cut}, ReasoningFormat::kHarmony);
      EXPECT_EQ(two.reasoning, c.reasoning) << text << " cut at " << cut;
      EXPECT_EQ(two.content, c.content) << text << " cut at " << cut;
    }
  }
}

}  // namespace
}  // namespace tessera
