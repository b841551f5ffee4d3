// The commands of the flashgen tool, one file each: what a command accepts (its Command, which gives its
// usage text and parses its arguments) and what it does. cli/main.cpp lists them and dispatches.
#pragma once

#include "cli/args.hpp"

namespace flashgen::cli {

Command info_command();
int command_info(const Args& args);

Command emit_command();
int command_emit(const Args& args);

Command compile_command();
int command_compile(const Args& args);

Command run_command();
int command_run(const Args& args);

Command demo_command();
int command_demo(const Args& args);

Command tune_command();
int command_tune(const Args& args);

Command db_command();
int command_db(const Args& args);

}  // namespace flashgen::cli
