#include "listing_parser.hpp"

#include <expat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace sluice::remote {

// Elements are matched by depth: ListBucketResult (1), its IsTruncated, NextContinuationToken and
// Contents (2), and a Contents' Key, Size and ETag (3). Text is kept only inside those.
struct ListingPage::Parser {
  ListingPage& page;
  XML_Parser xml = XML_ParserCreate("UTF-8");
  int depth = 0;
  bool is_listing = false, in_contents = false, keep_text = false;
  std::string text;
  ListedObject current;

  explicit Parser(ListingPage& p) : page(p) {
    XML_SetUserData(xml, this);
    XML_SetElementHandler(xml, &Parser::on_start, &Parser::on_end);
    XML_SetCharacterDataHandler(xml, &Parser::on_text);
  }
  ~Parser() { XML_ParserFree(xml); }

  static void on_start(void* user, const XML_Char* name, const XML_Char**) {
    auto& p = *static_cast<Parser*>(user);
    ++p.depth;
    if (p.depth == 1) p.is_listing = std::strcmp(name, "ListBucketResult") == 0;
    if (!p.is_listing) return;
    if (p.depth == 2 && std::strcmp(name, "Contents") == 0) {
      p.in_contents = true;
      p.current = {};
    }
    p.keep_text = (p.depth == 2 && (std::strcmp(name, "IsTruncated") == 0 || std::strcmp(name, "NextContinuationToken") == 0)) ||
                  (p.depth == 3 && p.in_contents);
    p.text.clear();
  }

  static void on_end(void* user, const XML_Char* name) {
    auto& p = *static_cast<Parser*>(user);
    if (p.is_listing && p.keep_text) {
      if (p.depth == 3 && std::strcmp(name, "Key") == 0) p.current.key = p.text;
      else if (p.depth == 3 && std::strcmp(name, "Size") == 0) p.current.size = std::strtoull(p.text.c_str(), nullptr, 10);
      else if (p.depth == 3 && std::strcmp(name, "ETag") == 0) p.current.etag = p.text;
      else if (p.depth == 2 && std::strcmp(name, "IsTruncated") == 0) p.page.truncated = p.text == "true";
      else if (p.depth == 2 && std::strcmp(name, "NextContinuationToken") == 0) p.page.next_token = p.text;
    }
    if (p.is_listing && p.depth == 2 && p.in_contents) {
      p.page.objects.push_back(std::move(p.current));
      p.in_contents = false;
    }
    p.keep_text = false;
    --p.depth;
  }

  static void on_text(void* user, const XML_Char* data, int length) {
    auto& p = *static_cast<Parser*>(user);
    if (p.keep_text) p.text.append(data, static_cast<std::size_t>(length));
  }

  bool parse(const char* data, std::size_t size, bool last) {
    if (XML_Parse(xml, data, static_cast<int>(size), last ? 1 : 0) == XML_STATUS_OK) return true;
    page.error_ = std::string("not XML at line ") + std::to_string(XML_GetCurrentLineNumber(xml)) + ", column " +
                  std::to_string(XML_GetCurrentColumnNumber(xml)) + ": " + XML_ErrorString(XML_GetErrorCode(xml));
    return false;
  }
};

ListingPage::ListingPage() : parser_(std::make_unique<Parser>(*this)) {}
ListingPage::~ListingPage() = default;

bool ListingPage::feed(const char* data, std::size_t size) {
  // XML_Parse takes an int length: a body arrives in chunks of curl's buffer, far below it.
  constexpr std::size_t kStep = 1 << 30;
  for (std::size_t at = 0; at < size; at += kStep)
    if (!parser_->parse(data + at, std::min(kStep, size - at), false)) return false;
  return true;
}

bool ListingPage::finish() {
  if (!parser_->parse("", 0, true)) return false;
  if (!parser_->is_listing) {
    error_ = "not a ListBucketResult document";
    return false;
  }
  return true;
}

}  // namespace sluice::remote
