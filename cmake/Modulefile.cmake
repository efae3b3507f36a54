# `cmake --install` writes an Lmod module file for the prefix it installs to,
#   PREFIX/share/modulefiles/ddl/VERSION.lua   (module use PREFIX/share/modulefiles; module load ddl)
# and the documentation the module's help names, PREFIX/share/doc/ddl. DDL_INSTALL_MODULEFILEDIR
# moves the module tree: relative to the prefix, or absolute (a site's own tree, e.g. /sw/modulefiles);
# the file is always DIR/ddl/VERSION.lua, Lmod's NAME/VERSION layout. The prefix is only known at
# install time (`cmake --install build --prefix DIR`), so the template is filled in two steps: the
# build's values now, the prefix when installing. A pip install (SKBUILD) has its env instead, and
# Spack writes its own module files: both leave the module file out (DDL_INSTALL_MODULEFILE=OFF).
include(GNUInstallDirs)

if(SKBUILD)
  set(ddl_modulefile_default OFF)
else()
  set(ddl_modulefile_default ON)
endif()
option(DDL_INSTALL_MODULEFILE "Install an Lmod module file (DDL_INSTALL_MODULEFILEDIR/ddl/VERSION.lua) and the docs it names"
       ${ddl_modulefile_default})
set(DDL_INSTALL_MODULEFILEDIR ${CMAKE_INSTALL_DATAROOTDIR}/modulefiles CACHE STRING
    "Module tree the module file goes into, as ddl/VERSION.lua (relative to the install prefix, or absolute)")

if(DDL_INSTALL_MODULEFILE)
  set(DDL_VERSION ${PROJECT_VERSION})
  set(DDL_DESCRIPTION ${PROJECT_DESCRIPTION})
  set(DDL_MODULE_DOCDIR ${CMAKE_INSTALL_DATAROOTDIR}/doc/ddl)
  if(DDL_INSTALL_PYTHON)
    set(DDL_MODULE_PYTHONDIR ${DDL_INSTALL_PYTHONDIR})
  else()
    set(DDL_MODULE_PYTHONDIR "")  # no Python package installed: no PYTHONPATH
  endif()
  set(DDL_MODULE_PREFIX "@DDL_MODULE_PREFIX@")  # kept for the second step
  set(DDL_MODULE_TREE "@DDL_MODULE_TREE@")
  configure_file(${CMAKE_CURRENT_LIST_DIR}/ddl-modulefile.lua.in ${CMAKE_BINARY_DIR}/ddl-modulefile.lua.in @ONLY)

  install(FILES README.md DESTINATION ${DDL_MODULE_DOCDIR})
  install(DIRECTORY docs/ DESTINATION ${DDL_MODULE_DOCDIR} FILES_MATCHING PATTERN "*.md")

  install(CODE "set(ddl_modulefile_template [[${CMAKE_BINARY_DIR}/ddl-modulefile.lua.in]])
                set(ddl_modulefile_tree [[${DDL_INSTALL_MODULEFILEDIR}]])
                set(ddl_modulefile_name [[${PROJECT_VERSION}.lua]])")
  install(CODE [[
    get_filename_component(DDL_MODULE_PREFIX "${CMAKE_INSTALL_PREFIX}" ABSOLUTE)
    get_filename_component(DDL_MODULE_TREE "${ddl_modulefile_tree}" ABSOLUTE BASE_DIR "${DDL_MODULE_PREFIX}")
    set(ddl_modulefile "$ENV{DESTDIR}${DDL_MODULE_TREE}/ddl/${ddl_modulefile_name}")
    message(STATUS "Installing: ${ddl_modulefile}")
    configure_file("${ddl_modulefile_template}" "${ddl_modulefile}" @ONLY)
    list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${ddl_modulefile}")
  ]])
endif()
