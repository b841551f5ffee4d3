# Compiles every template on its own with nvcc (-DFLASHGEN_STANDALONE instantiates a default config)
# for sm_80 and sm_90a; the sm90 family's templates (wgmma, TMA, setmaxnreg) for sm_90a only; then checks
# the variant policies on the host (variant_check.cu). Run by CTest: cmake -DNVCC=... -DTEMPLATE_DIR=...
# -DWORK_DIR=... -P standalone.cmake
file(GLOB templates ${TEMPLATE_DIR}/*.cuh)
file(MAKE_DIRECTORY ${WORK_DIR})
foreach(path IN LISTS templates)
  get_filename_component(name ${path} NAME_WE)
  foreach(arch 80 90a)
    if(name MATCHES "sm90" AND arch STREQUAL "80")
      continue()
    endif()
    execute_process(
      COMMAND ${NVCC} -x cu -std=c++17 -DFLASHGEN_STANDALONE -I${TEMPLATE_DIR}
              -gencode=arch=compute_${arch},code=sm_${arch} -c ${path} -o ${WORK_DIR}/${name}_sm${arch}.o
      RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT result EQUAL 0)
      message(FATAL_ERROR "nvcc failed on ${path} for sm_${arch}:\n${out}${err}")
    endif()
    message(STATUS "${name}.cuh compiles on its own for sm_${arch}")
  endforeach()
endforeach()

# Every variant policy agrees with its own visible() (variant_check.cu, host code).
get_filename_component(check_dir ${CMAKE_CURRENT_LIST_DIR} ABSOLUTE)
execute_process(
  COMMAND ${NVCC} -x cu -std=c++17 -I${TEMPLATE_DIR} ${check_dir}/variant_check.cu -o ${WORK_DIR}/variant_check
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "nvcc failed on variant_check.cu:\n${out}${err}")
endif()
execute_process(COMMAND ${WORK_DIR}/variant_check RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "variant_check failed:\n${out}${err}")
endif()
message(STATUS "${out}")
