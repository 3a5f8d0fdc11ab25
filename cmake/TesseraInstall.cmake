# tessera as an installed CMake package (docs/API.md): `cmake --install build --prefix P` puts the
# layer libraries, the public headers, the `tessera` command and tesseraConfig.cmake (with its
# version file and exported targets) under P; an outside project then writes
#   find_package(tessera 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE tessera::tessera)
# Targets: tessera::tessera (everything) and one per layer, tessera::core ... tessera::train, tessera::plan.
#
# Public headers are listed per layer below; every other header is internal and not installed.
# Configuring fails when a public header includes a header that is not public, so the installed
# set is closed under #include (tests/install compiles each installed header on its own).
# A new layer library (a folder under src/tessera) needs its own list here.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TESSERA_PUBLIC_HEADERS_core allocator.h cpu_time.h dtype.h error.h mapped_file.h philox.h tensor.h
    trace.h)
set(TESSERA_PUBLIC_HEADERS_kernels
    attention.h bf16.h blas_setup.h cpu_features.h dropout.h embedding.h flash_attention.h gelu.h
    gemm.h layernorm.h precision.h residual.h rmsnorm.h rope.h row_map.h softmax_xent.h swiglu.h)
# op.h is the backend-facing detail of communicator.h: installed, not stable.
set(TESSERA_PUBLIC_HEADERS_comm
    bench.h communicator.h errors.h fault.h flight_doctor.h flight_recorder.h launch.h op.h
    options.h wire.h work.h)
set(TESSERA_PUBLIC_HEADERS_nn
    activations.h attention.h attention_branch.h block.h block_workspace.h context_parallel.h
    context_parallel_attention.h
    embedding.h gelu_mlp.h
    gpt.h gpt_config.h gpt_costs.h head.h linear.h mlp.h moe.h moe_exchange.h moe_experts.h
    moe_mlp.h moe_router.h parameters.h rotary_attention.h stage_model.h swiglu_mlp.h
    swiglu_moe_mlp.h tensor_parallel.h
    unit_hooks.h unit_model.h)
set(TESSERA_PUBLIC_HEADERS_optim adamw.h grad_clip.h lr_schedule.h optimizer.h sgd.h)
set(TESSERA_PUBLIC_HEADERS_data
    bpe_tokenizer.h bpe_tokenizer_adapter.h corpus.h dataset.h eval_windows.h load_tokenizer.h
    prepare.h sampler.h token_file.h token_source.h tokenizer.h)
set(TESSERA_PUBLIC_HEADERS_io atomic_file.h checkpoint.h checksum.h hf_config.h safetensors.h
    tensor_set.h)
# buckets.h and zero.h are the engine's internals that data_parallel.h needs: installed, not stable.
set(TESSERA_PUBLIC_HEADERS_parallel
    buckets.h data_parallel.h gather.h mesh.h rank_engines.h unit_timeline.h zero.h zero_stage.h
    pipeline/pipeline_split.h pipeline/schedule.h pipeline/schedule_deadlock.h
    pipeline/schedule_generators.h pipeline/schedule_replay.h pipeline/schedule_simulate.h
    pipeline/schedule_validate.h pipeline/step_executor.h)
set(TESSERA_PUBLIC_HEADERS_train
    generate.h metrics.h model_io.h pipeline_forward.h plan_of.h stop_request.h train_config.h
    trainer.h)
# The planner: `tessera plan`'s model of memory and step time, usable from code.
set(TESSERA_PUBLIC_HEADERS_plan
    calibrate.h cluster.h collectives.h context_parallel.h cross_node.h engine.h
    gemm_efficiency.h korthikanti.h layout.h model_spec.h planner.h report.h work.h)

# The generated version header, tessera/version.h.
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in
               ${PROJECT_BINARY_DIR}/include/tessera/version.h @ONLY)

set(tessera_src ${PROJECT_SOURCE_DIR}/src/tessera)
set(tessera_installed_headers tessera/version.h)  # paths relative to the include root
set(tessera_exported_targets tessera_all)
foreach(layer ${TESSERA_LAYERS})
  if(NOT TARGET tessera_${layer})
    continue()
  endif()
  if(NOT DEFINED TESSERA_PUBLIC_HEADERS_${layer})
    message(FATAL_ERROR "cmake/TesseraInstall.cmake: the layer '${layer}' has no list of public "
                        "headers; add set(TESSERA_PUBLIC_HEADERS_${layer} ...) there (or an empty "
                        "list when none of its headers is public).")
  endif()
  file(STRINGS ${PROJECT_SOURCE_DIR}/src/tessera/tessera.h in_umbrella
       REGEX "^#include \"tessera/${layer}\\.h\"")
  if(NOT EXISTS ${PROJECT_SOURCE_DIR}/src/tessera/${layer}.h OR NOT in_umbrella)
    message(FATAL_ERROR "the layer '${layer}' needs its public header src/tessera/${layer}.h "
                        "(including its public headers), included from src/tessera/tessera.h.")
  endif()
  set_target_properties(tessera_${layer} PROPERTIES EXPORT_NAME ${layer})
  list(APPEND tessera_exported_targets tessera_${layer})
  list(APPEND tessera_installed_headers tessera/${layer}.h)
  foreach(h ${TESSERA_PUBLIC_HEADERS_${layer}})
    list(APPEND tessera_installed_headers tessera/${layer}/${h})
  endforeach()
  install(FILES ${tessera_src}/${layer}.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera)
  foreach(h ${TESSERA_PUBLIC_HEADERS_${layer}})  # keeping subfolders (parallel/pipeline/)
    get_filename_component(subdir ${h} DIRECTORY)
    install(FILES ${tessera_src}/${layer}/${h}
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera/${layer}/${subdir})
  endforeach()
endforeach()
list(APPEND tessera_installed_headers tessera/tessera.h)
# The CUDA path (TESSERA_CUDA), where built: tessera::cuda, exported because tessera_train links it
# (--device cuda); its headers are not installed (no public API yet), and the package's config
# then finds the CUDA toolkit for the CUDA libraries it links.
if(TARGET tessera_cuda)
  set_target_properties(tessera_cuda PROPERTIES EXPORT_NAME cuda)
  list(APPEND tessera_exported_targets tessera_cuda)
  set(TESSERA_CONFIG_WITH_CUDA ON)
else()
  set(TESSERA_CONFIG_WITH_CUDA OFF)
endif()
install(FILES ${tessera_src}/tessera.h ${PROJECT_BINARY_DIR}/include/tessera/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera)

# Closure: every "tessera/..." include of an installed header is installed.
foreach(h ${tessera_installed_headers})
  if(h STREQUAL "tessera/version.h")
    continue()
  endif()
  file(STRINGS ${PROJECT_SOURCE_DIR}/src/${h} includes REGEX "^#include [\"<]tessera/")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include [\"<]([^\">]+)[\">].*" "\\1" included "${line}")
    if(NOT included IN_LIST tessera_installed_headers)
      message(FATAL_ERROR "src/${h} is a public header but includes ${included}, which is not: "
                          "add it to its layer's list in cmake/TesseraInstall.cmake or stop "
                          "including it from a public header.")
    endif()
  endforeach()
endforeach()
# For tests/install: the installed headers that tessera's own build does not already compile
# alone. A header whose own .cc includes it first compiles on its own in every build, and the
# closure above makes the installed copy see the same headers; the layer headers tessera/<layer>.h
# are subsets of tessera/tessera.h. The rest are compiled alone from the install.
set(tessera_headers_alone "")
foreach(h ${tessera_installed_headers})
  string(REGEX MATCH "^tessera/[a-z_]+\\.h$" umbrella "${h}")
  if(umbrella AND NOT h STREQUAL "tessera/tessera.h" AND NOT h STREQUAL "tessera/version.h")
    continue()
  endif()
  string(REGEX REPLACE "\\.h$" ".cc" cc "${PROJECT_SOURCE_DIR}/src/${h}")
  set(first "")
  if(EXISTS ${cc})
    file(STRINGS ${cc} first REGEX "^#include " LIMIT_COUNT 1)
  endif()
  if(NOT first STREQUAL "#include \"${h}\"")
    list(APPEND tessera_headers_alone ${h})
  endif()
endforeach()
list(JOIN tessera_headers_alone "\n" headers_alone_text)
file(WRITE ${PROJECT_BINARY_DIR}/tessera_headers_alone.txt "${headers_alone_text}\n")

set_target_properties(tessera_all PROPERTIES EXPORT_NAME tessera)
install(TARGETS ${tessera_exported_targets} EXPORT tesseraTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})  # include path: tessera::core's
if(TARGET tessera)
  install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(tessera_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
install(EXPORT tesseraTargets NAMESPACE tessera:: DESTINATION ${tessera_cmake_dir})
# Dependencies the config must find again: what the exported targets link.
if(TARGET MPI::MPI_CXX AND MPI_FOUND)
  set(TESSERA_CONFIG_WITH_MPI ON)
else()
  set(TESSERA_CONFIG_WITH_MPI OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tesseraConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tesseraConfig.cmake
                              INSTALL_DESTINATION ${tessera_cmake_dir})
# 0.x: a minor version may change the API (docs/API.md, "What is stable").
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tesseraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tesseraConfig.cmake
              ${PROJECT_BINARY_DIR}/tesseraConfigVersion.cmake
        DESTINATION ${tessera_cmake_dir})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(FILES ${PROJECT_SOURCE_DIR}/docs/API.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# Debian package of the same files: cpack -G DEB (in the build directory).
set(CPACK_PACKAGE_NAME tessera-dev)
set(CPACK_PACKAGE_VENDOR "tessera")
set(CPACK_PACKAGE_CONTACT "tessera maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "C++20 library for training GPT models across many ranks (static libraries, headers, CMake package)")
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libopenblas-dev, nlohmann-json3-dev, libisal-dev, pkg-config, libpcre2-dev, libsentencepiece-dev")
if(TESSERA_CONFIG_WITH_MPI)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libopenmpi-dev")
endif()
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
