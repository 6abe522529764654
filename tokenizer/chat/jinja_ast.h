// The parsed form of a template: expressions and statements.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat/jinja_error.h"
#include "tokenizer/chat/jinja_value.h"

namespace qtk::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using NamedArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // children[0].name
    kItem,     // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]] (null: omitted)
    kCall,     // children[0](children[1..], named)
    kFilter,   // children[0] | name(children[1..], named)
    kTest,     // children[0] is [not] name(children[1..], named)
    kNeg,      // -children[0]
    kPos,      // +children[0]
    kNot,      // not children[0]
    kBinary,   // children[0] op children[1]: + - * / // % ** ~
    kAnd,
    kOr,
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ...
    kCond,     // children[1] if children[0] else children[2] (null: no else)
    kList,
    kTuple,
    kDict,  // children: key0, value0, key1, value1, ...
  };
  Kind kind;
  SourcePos pos;
  Value literal;
  std::string name;      // kName, kAttr, kFilter, kTest; kBinary: the operator
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> children;
  NamedArgs named;
  std::vector<std::string> ops;  // kCompare
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not given)
};

struct Node {
  enum class Kind {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // branches; else_body
    kFor,        // for targets in expr [if cond]: body; else_body
    kSet,        // set targets = expr; or set targets[0].attr = expr (attr non-empty)
    kSetBlock,   // set targets[0] %}body{% endset (filters applied to the captured text)
    kMacro,      // macro name(params): body
    kCallBlock,  // call expr (a macro call) with caller() = body
    kBreak,
    kContinue,
    kScope,  // a body rendered in place ({% generation %})
  };
  Kind kind;
  SourcePos pos;
  std::string text;
  std::string name;  // kMacro
  std::string attr;  // kSet of a namespace attribute
  ExprPtr expr;
  ExprPtr cond;                                    // kFor filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  std::vector<std::string> targets;                // kFor, kSet, kSetBlock
  std::vector<ExprPtr> filters;                    // kSetBlock: kFilter nodes on a null subject
  std::vector<MacroParam> params;                  // kMacro, kCallBlock (caller's)
  Body body, else_body;
};

}  // namespace qtk::jinja
